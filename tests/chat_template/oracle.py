#!/usr/bin/env python3
"""Renders chat-template cases with Python Jinja2 the way transformers does.

Input (argv[1]): JSON array of {"template": str, "context": {...}}.
Output (stdout): JSON array of {"ok": true, "out": str} or {"ok": false, "error": str}.
Environment as in transformers' render_jinja_template: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, its own tojson, raise_exception and strftime_now.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    results = []
    for case in cases:
        try:
            out = env.from_string(case["template"]).render(**case["context"])
            results.append({"ok": True, "out": out})
        except Exception as e:  # report every failure as data: the caller compares
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
