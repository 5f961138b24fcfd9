"""`tightfit generate`: one prompt in, tokens streamed out (or one JSON object with --json)."""
from __future__ import annotations

import argparse
import json
import sys

from tightfit.cli.common import (add_model_args, add_runtime_arg, add_sampling_args, build_llm,
                                 peak_rss_mb, sampling_from_args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate a completion for PROMPT, streaming tokens as they "
                                   "come. With --chat the prompt is sent as a user message "
                                   "through the model's chat template.")
    p.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: token ids, text, TTFT, decode tok/s, peak RSS")
    add_model_args(p)
    add_runtime_arg(p)
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_from_args(args)  # validate before the (slow) model load
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    llm = build_llm(args)
    prompt = llm.chat_prompt([{"role": "user", "content": text}]) if args.chat else text
    stream = None if args.json else (lambda o: (sys.stdout.write(o.delta_text), sys.stdout.flush()))
    out = llm.generate([prompt], params, on_output=stream)[0]
    if args.json:
        print(json.dumps({
            "text": out.text, "token_ids": out.token_ids,
            "prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(out.token_ids),
            "finish_reason": out.finish_reason, "ttft_s": out.ttft_s,
            "decode_tok_s": out.decode_tok_s, "load_time_s": llm.load_time_s,
            "peak_rss_mb": round(peak_rss_mb(), 1), "quant": args.quant,
        }))
    else:
        print()
    return 0
