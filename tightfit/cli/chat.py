"""`tightfit chat`: an interactive conversation with a model, replies streamed token by token.
Commands: /reset clears the history, /exit (or Ctrl-D) quits."""
from __future__ import annotations

import argparse
import json
import sys

from tightfit.cli.common import (add_model_args, add_runtime_arg, add_sampling_args, build_llm,
                                 peak_rss_mb, sampling_from_args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a model in the terminal",
                       description="Interactive chat. Type a message and press Enter; /reset "
                                   "clears the conversation, /exit or Ctrl-D quits.")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--json", action="store_true",
                   help="after each reply print a JSON line with token ids, TTFT, tok/s, RSS")
    add_model_args(p)
    add_runtime_arg(p)
    add_sampling_args(p, max_tokens=256)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_from_args(args)
    print("tightfit: loading model ...", file=sys.stderr, flush=True)
    llm = build_llm(args)
    name = llm.loaded.config.name or llm.loaded.path.name
    print(f"tightfit: {name} ready in {llm.load_time_s:.1f} s ({args.quant}). "
          "Type a message; /reset clears, /exit quits.", file=sys.stderr, flush=True)
    history = [{"role": "system", "content": args.system}] if args.system else []
    base = list(history)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("\n> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        msg = line.strip()
        if msg in ("/exit", "/quit"):
            break
        if msg == "/reset":
            history = list(base)
            continue
        if not msg:
            continue
        history.append({"role": "user", "content": msg})
        out = llm.generate([llm.chat_prompt(history)], params,
                           on_output=lambda o: (sys.stdout.write(o.delta_text), sys.stdout.flush()))[0]
        print()
        history.append({"role": "assistant", "content": out.text})
        if args.json:
            print(json.dumps({"token_ids": out.token_ids, "ttft_s": out.ttft_s,
                              "decode_tok_s": out.decode_tok_s,
                              "cached_prompt_tokens": out.num_cached_tokens,
                              "peak_rss_mb": round(peak_rss_mb(), 1)}), flush=True)
    return 0
