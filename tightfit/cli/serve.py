"""`tightfit serve`: an OpenAI-compatible HTTP server on a model (default: the embedded one).
A thin shell over tightfit.server; binds 127.0.0.1 unless told otherwise."""
from __future__ import annotations

import argparse
import os
import sys

from tightfit.cli.common import add_model_args, add_runtime_arg, build_llm
from tightfit.server.config import API_KEY_ENV, ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Start an OpenAI-compatible server (/v1/chat/completions, /v1/completions, "
                    "/v1/models, /v1/predict, /health, /metrics). Prints where it listens and a "
                    "curl command to try it. SIGTERM or Ctrl-C lets in-flight requests finish, "
                    "then exits.")
    add_model_args(p)
    add_runtime_arg(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1, this machine only)")
    g.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 = any)")
    g.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every endpoint but /health "
                        f"(default: the {API_KEY_ENV} environment variable, if set)")
    g.add_argument("--max-num-seqs", type=int, default=32,
                   help="sequences decoded together in one batch (default: 32)")
    g.add_argument("--max-queue", type=int, default=256,
                   help="sequences that may wait beyond the batch; more get 429 (default: 256)")
    g.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="larger request bodies get 413 (default: 1048576)")
    g.add_argument("--served-model-name", default=None,
                   help="model name in /v1/models and requests (default: the file's name)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take after SIGTERM (default: 30)")
    g.add_argument("--access-log", action="store_true", help="log one line per HTTP request")
    g.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default: warning)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host, port=args.port, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
        model_name=args.served_model_name, drain_timeout_s=args.drain_timeout,
        access_log=args.access_log)


def run(args: argparse.Namespace) -> int:
    from tightfit.server.app import create_app, default_model_name
    from tightfit.server.launch import banner, serve

    config = config_from_args(args)  # refuse bad options before the (slow) model load
    print(f"loading {args.model or 'the embedded default model'} ...", file=sys.stderr, flush=True)
    if getattr(args, "compile", False):
        print("compiling the decode step (--compile): minutes on the first start, about a minute "
              "once Inductor's disk cache holds it ...", file=sys.stderr, flush=True)
    llm = build_llm(args, max_num_seqs=args.max_num_seqs)
    app = create_app(llm, config)
    name = config.model_name or default_model_name(llm)
    serve(app, config, lambda url: print(banner(url, name, config), flush=True), args.log_level)
    print("tightfit serve: drained and stopped", file=sys.stderr, flush=True)
    return 0
