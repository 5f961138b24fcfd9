"""The measurement harness. workloads (scenario templates -> seeded request lists) · backends/
(tightfit in process and over HTTP, HF Transformers, llama.cpp, a simulated one for tests) ·
worker (one process per model load) · runner (tasks -> measurements) · metrics · fingerprint ·
compare (`tightfit bench`) · sweep (YAML -> tasks, resumable) · report / plots · session (progress
and storing). The parent side imports no torch; backends run in worker processes.
"""
