"""The OpenAI-compatible HTTP server: `create_app(llm, config)` in app.py, the engine thread
bridge in engine_loop.py, metrics and the resource monitor. Importing this package loads no
torch and no FastAPI; the submodules do what they name."""
