#!/usr/bin/python3
# Reference renderer for arbor's Jinja engine: Debian's python3-jinja2 configured exactly as Hugging Face
# transformers configures it for chat templates (chat_template_utils._compile_jinja_template).
#
#   /usr/bin/python3 tools/jinja/render_reference.py CASES.json OUT.json
#
# CASES.json is a list of objects:
#   {"name": ..., "template": "...", "context": {...}}             render a template with a context
#   {"name": ..., "model_dir": "DIR", "template_name": "default"|..., "messages": [...], "tools": [...] | null,
#    "add_generation_prompt": bool, "kwargs": {...}}                 render like tokenizer.apply_chat_template
# OUT.json is a list of {"name": ..., "output": "..."} or {"name": ..., "error": "ExceptionType: message"}.
# Run it with /usr/bin/python3 (Debian's jinja2), not another interpreter on PATH.
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    # transformers' {% generation %} ... {% endgeneration %}: renders its body unchanged.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides Jinja's tojson: no HTML escaping, keys in insertion order.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_content(tok):
    # tokenizer_config.json holds special tokens as strings or as AddedToken objects {"content": ...}.
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def chat_template_and_context(case, root):
    model_dir = os.path.join(root, case["model_dir"])
    cfg = {}
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    name = case.get("template_name") or "default"
    template = None
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    else:
        t = cfg.get("chat_template")
        if isinstance(t, list):
            template = {x["name"]: x["template"] for x in t}.get(name)
        else:
            template = t
    if template is None:
        raise ValueError("no chat template")
    context = {
        "messages": case["messages"],
        "tools": case.get("tools"),
        "documents": None,
        "add_generation_prompt": case.get("add_generation_prompt", False),
    }
    # transformers passes the special tokens map, then the caller's kwargs.
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = token_content(cfg.get(key))
        if isinstance(value, str):
            context[key] = value
    context.update(case.get("kwargs") or {})
    return template, context


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = environment()
    out = []
    for case in cases:
        result = {"name": case["name"]}
        try:
            if "model_dir" in case:
                template, context = chat_template_and_context(case, root)
            else:
                template, context = case["template"], case.get("context") or {}
            result["output"] = env.from_string(template).render(**context)
        except Exception as e:  # the golden records that rendering must fail
            result["error"] = f"{type(e).__name__}: {e}"
        out.append(result)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
