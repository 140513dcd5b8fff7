#!/usr/bin/python3
# Writes tests/fixtures/jinja/cases.json: small templates, one feature each, that test_jinja renders and
# compares byte for byte with the reference (tools/jinja/render_reference.py). Regenerate both with
#   tools/jinja/regenerate.sh
import json
import os
import sys

MSGS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
]
CTX = {
    "xs": [3, 1, 2],
    "words": ["b", "A", "c", "a"],
    "d": {"b": 1, "a": 2, "C": 3},
    "s": "  Hello World  ",
    "u": "héllo wörld ünïcode 日本語",
    "n": 5,
    "f": 2.5,
    "t": True,
    "nothing": None,
    "empty": [],
    "msgs": MSGS,
    "users": [{"name": "bob", "age": 30, "admin": False}, {"name": "Al", "age": 25, "admin": True},
              {"name": "cy", "age": 35}],
    "nested": {"a": {"b": {"c": [10, 20]}}},
}

cases = []


def case(name, template, context=None):
    cases.append({"name": name, "template": template, "context": CTX if context is None else context})


# ---- output and literals
case("text_only", "just text\nwith lines\n")
case("trailing_newline_kept_once", "a\n\n")
case("crlf_normalised", "a\r\nb\rc\n")
case("print_int_float", "{{ 1 }} {{ 1.0 }} {{ 1.5e3 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789012345678 }} {{ 0.1 + 0.2 }} {{ -0.0 }}")
case("print_bool_none", "{{ true }} {{ false }} {{ True }} {{ none }} {{ None }} {{ nothing }}")
case("print_list_dict_tuple", "{{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v', 'n': [1]} }} {{ (1,) }} {{ (1, 'x') }} {{ () }}")
case("print_string_repr_quotes", "{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'bs\\\\'] }}")
case("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\101\\q' }}")
case("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}")
case("integer_forms", "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}")
case("unicode_passthrough", "{{ u }}|{{ u|length }}|{{ u[0] }}|{{ u[-3:] }}|{{ u|upper }}")
case("comments", "a{# comment #}b{#- trimmed -#}  c\n{# line #}\nd")
case("raw_block", "{% raw %}{{ not parsed }}{% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}  |")
case("raw_lstrip", "line\n    {% raw %}\n  {{ x }}\n    {% endraw %}\nafter")

# ---- whitespace control with trim_blocks + lstrip_blocks
case("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
case("ws_lstrip_blocks", "  {% if true %}\n  indented\n  {% endif %}\ndone")
case("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c")
case("ws_var_minus", "a  {{- 'x' -}}  b {{ 'y' }}  c")
case("ws_plus_disables_lstrip", "  {%+ if true %}x{% endif +%}\ny")
case("ws_var_not_lstripped", "  {{ 'v' }}\n  {% if true %}z{% endif %}")
case("ws_comment_lstrip_trim", "a\n  {# c #}\nb")
case("ws_mixed_tabs", "\t {% for i in [1,2] %}\n\t{{ i }}\n\t {% endfor %}\nend")
case("ws_midline_block_not_lstripped", "x  {% if true %}y{% endif %}")
case("ws_minus_newlines", "a\n\n  {{- 'b' }}\n\n{%- if true %}\n\nc{% endif %}")

# ---- statements
case("if_elif_else", "{% for v in [1, 2, 3, 0] %}{% if v == 1 %}one{% elif v == 2 %}two{% elif v %}many{% else %}zero{% endif %},{% endfor %}")
case("for_loop_fields",
     "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}")
case("for_prev_next", "{% for x in xs %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}")
case("for_prev_next_defined", "{% for x in xs %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }} {% endfor %}")
case("for_cycle", "{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}")
case("for_else", "{% for x in empty %}x{% else %}none{% endfor %}|{% for x in xs %}{{ x }}{% else %}no{% endfor %}")
case("for_filter", "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}")
case("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}")
case("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}")
case("for_string", "{% for c in 'héy' %}[{{ c }}]{% endfor %}")
case("for_nested_loop", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }}{{ b }} {% endfor %}{% endfor %}")
case("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case("for_undefined_is_empty", "[{% for x in missing %}{{ x }}{% endfor %}]")
case("for_scope", "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}")
case("for_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}")
case("set_and_tuple_unpack", "{% set a = 1 %}{% set b, c = 2, 'three' %}{{ a }}{{ b }}{{ c }}")
case("set_block", "{% set block %}\n  inner {{ n }}\n{% endset %}[{{ block }}]")
case("set_block_filter", "{% set block | upper | trim %}  text {{ n }}  {% endset %}[{{ block }}]")
case("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}")
case("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}")
case("macro_basic", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}")
case("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}")
case("macro_sees_later_globals", "{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}")
case("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) }}")
case("macro_missing_arg_undefined", "{% macro m(a, b) %}[{{ a }}][{{ b }}]{{ b is defined }}{% endmacro %}{{ m(1) }}")
case("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}")
case("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each(xs) %}<{{ x }}>{% endcall %}")
case("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'o') | title %}banana split{% endfilter %}")
case("with_block", "{% with a = 1, b = n %}{{ a + b }}{% endwith %}{{ a is defined }}")
case("generation_tag", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}")

# ---- expressions and operators
case("arith", "{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 2 }} {{ 2 ** 10 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 4 / 2 }}")
case("arith_precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 100 / 10 / 2 }} {{ 1 ~ 2 + 3 }}")
case("err_concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 + 4 }}")
case("arith_bool_int", "{{ true + 1 }} {{ true * 3.0 }} {{ false - 1 }}")
case("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true ~ missing }} {{ [1] + [2, 3] }} {{ [0] * 3 }}")
case("unary", "{{ -n }} {{ +n }} {{ - -n }} {{ not t }} {{ not not nothing }} {{ -f }} {{ -3|abs }}")
case("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 4 >= 4 }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ true == 1 }} {{ none == none }} {{ 'a' == 'a' }}")
case("chained_comparisons", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 3 > 2 > 1 }} {{ 1 == 1 < 2 }} {{ 1 < n <= 5 }}")
case("in_not_in", "{{ 1 in xs }} {{ 4 not in xs }} {{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 'z' in d }} {{ 'x' not in 'abc' }} {{ 1 in missing }}")
case("logic_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} {{ 1 and 0 or 2 }} {{ not 0 and 1 }}")
case("cond_expr", "{{ 'yes' if t else 'no' }} {{ 'yes' if nothing else 'no' }} [{{ 'x' if false }}] {{ 1 if false else 2 if true else 3 }}")
case("attr_and_item", "{{ nested.a.b.c[1] }} {{ nested['a']['b']['c'][0] }} {{ msgs[0].role }} {{ msgs.0.content }} {{ d.b }} {{ xs[-1] }}")
case("dict_method_vs_key", "{{ {'items': 1}.items()|list }} {{ {'items': 1}['items'] }} {{ {'keys': 5}.get('keys') }}")
case("slicing", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }} {{ 'abcdef'[-2:] }} {{ xs[5:] }} {{ xs[-10:2] }} {{ 'héllo'[1:3] }} {{ (1, 2, 3)[1:] }} {{ xs[2:0:-1] }}")
case("list_dict_literals", "{{ [] }} {{ {} }} {{ [1, [2, [3]]] }} {{ {'a': {'b': 1}}['a']['b'] }} {{ [1, 2,] }} {{ {'x': 1,} }}")
case("tuple_in_print", "{{ 1, 2 }}")
case("call_globals", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b='x') }} {{ range(0)|list }}")
case("joiner", "{% set comma = joiner(', ') %}{% for x in xs %}{{ comma() }}{{ x }}{% endfor %}")
case("strftime_literal", "{{ strftime_now('x%%y') }}")
case("string_in_condition", "{% if 'b' in 'abc' and not ('z' in 'abc') %}ok{% endif %}")
case("undefined_print_and_tests", "[{{ missing }}] {{ missing is defined }} {{ missing is undefined }} {{ d.nope is defined }} {{ missing|default('dflt') }} {{ none|default('x') }} {{ ''|default('e', true) }} {{ missing|d('short') }}")
case("undefined_iter_len", "{{ missing|length }} {{ missing|list }} [{{ missing|join(',') }}] [{{ missing|string }}] {{ missing|first is defined }} [{{ missing|trim }}]")
case("undefined_eq", "{{ missing == missing }} {{ missing == none }} {{ missing != 1 }} {{ not missing }}")
case("none_attr_is_undefined", "[{{ nothing.foo }}] {{ nothing.foo is defined }}")

# ---- tests
case("tests_types", "{% for v in [none, true, 1, 1.5, 'a', [1], {'a': 1}, (1,)] %}{{ v is none }}{{ v is boolean }}{{ v is integer }}{{ v is float }}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is callable }}|{% endfor %}")
case("tests_values", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }} {{ n is eq 5 }} {{ n is ne 5 }} {{ n is lt 6 }} {{ n is gt 6 }} {{ n is le 5 }} {{ n is ge 6 }} {{ 2 is in xs }} {{ n is equalto 5 }} {{ n is sameas 5 }} {{ none is sameas none }}")
case("tests_misc", "{{ range is callable }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ n is not none }} {{ missing is not defined }} {{ 'x' is escaped }} {{ 1 is greaterthan 0 }} {{ 1 is lessthan 0 }}")

# ---- filters
case("f_string_case", "{{ 'hELLO wORLD'|lower }} {{ 'hello'|upper }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello world-foo(bar) o\\'neil'|title }} {{ s|trim }}| {{ 'xxhixx'|trim('x') }}")
case("f_length_count", "{{ xs|length }} {{ 'héllo'|length }} {{ d|length }} {{ xs|count }} {{ ''|length }}")
case("f_list_first_last", "{{ 'abc'|list }} {{ d|list }} {{ xs|first }} {{ xs|last }} {{ 'xyz'|first }} {{ 'xyz'|last }} {{ empty|first is defined }}")
case("f_join", "{{ xs|join }} {{ xs|join(', ') }} {{ users|join('/', attribute='name') }} {{ [1, none, 'a']|join('-') }}")
case("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ s|replace(' ', '') }}")
case("f_string_int_float", "{{ 42|string }} {{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(0, 16) }} {{ '1A'|int(base=16) }} {{ 3.99|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ ' 12 '|int }} {{ true|int }}")
case("f_abs_round", "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1.23456|round(3) }} {{ 7|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ -0.5|round }} {{ 1234.5|round(-2) }}")
case("f_items_dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(true) }} {{ d|dictsort(by='value', reverse=true) }} {{ {'b': 1, 'a': 2}|dictsort(false, 'value') }}")
case("f_map", "{{ users|map(attribute='name')|list }} {{ words|map('upper')|join }} {{ users|map(attribute='admin', default='?')|list }} {{ ['1', '2']|map('int')|sum }} {{ xs|map('string')|join('+') }}")
case("f_select_reject", "{{ range(10)|select('odd')|list }} {{ range(10)|reject('even')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ xs|select('gt', 1)|list }} {{ xs|reject('in', [1, 2])|list }} {{ words|select('lower')|list }}")
case("f_selectattr", "{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('age', 'gt', 28)|map(attribute='name')|list }} {{ users|selectattr('admin', 'defined')|list|length }} {{ msgs|selectattr('role', 'eq', 'user')|list }} {{ msgs|selectattr('role', 'equalto', 'system')|map(attribute='content')|first }}")
case("f_sort", "{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|sort(attribute='name')|map(attribute='name')|list }}")
case("f_unique_reverse", "{{ [1, 2, 1, 3, 2]|unique|list }} {{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ xs|reverse|list }} {{ 'héllo'|reverse }}")
case("f_min_max_sum", "{{ xs|min }} {{ xs|max }} {{ words|min }} {{ words|max }} {{ words|max(case_sensitive=true) }} {{ xs|sum }} {{ xs|sum(start=10) }} {{ users|sum(attribute='age') }} {{ [1.5, 2]|sum }} {{ users|max(attribute='age') }} {{ empty|max is defined }}")
case("f_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}|{{ 'a\\r\\nb'|indent(1) }}")
case("f_tojson",
     "{{ d|tojson }} {{ msgs[0]|tojson }} {{ 'héllo \"q\" <b> \\n'|tojson }} {{ [1, 2.5, none, true]|tojson }} {{ {'x': {'y': []}, 'z': {}}|tojson }} {{ (1, 2)|tojson }} {{ {1: 'a', true: 'b', none: 'c', 2.5: 'd'}|tojson }}")
case("f_tojson_indent", "{{ nested|tojson(indent=2) }}\n{{ msgs[:1]|tojson(indent=4) }}\n{{ d|tojson(sort_keys=true) }}\n{{ d|tojson(separators=(',', ':')) }}\n{{ 'é'|tojson(ensure_ascii=true) }}\n{{ xs|tojson(indent=0) }}\n{{ {'a': 1}|tojson(indent='\\t') }}\n{{ [[], {}]|tojson(indent=2) }}")
case("f_tojson_floats", "{{ [1.0, 0.1, 1e-7, 1e22, 123456789.123, -0.0, 3]|tojson }}")
case("f_batch", "{{ xs|batch(2)|list }} {{ xs|batch(2, 'x')|list }}")
case("f_wordcount_center", "{{ 'hello big  world, again'|wordcount }} [{{ 'ab'|center(6) }}] [{{ 'abc'|center(6) }}]")
case("f_safe_escape", "{{ '<a>'|safe }} {{ '<a href=\"x\">&\\''|e }} {{ '<b>'|escape }}")
case("f_attr", "{{ msgs|first|attr('role') is defined }} {{ 'abc'|attr('upper') is callable }}")
case("f_chains", "{{ users|map(attribute='name')|map('upper')|sort|join(',') }} {{ msgs|map(attribute='content')|map('length')|list }}")

# ---- Python methods
case("m_strip", "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ '\\n\\nx\\n'.strip('\\n') }}] [{{ 'xyhixy'.strip('xy') }}] [{{ 'aab'.lstrip('a') }}] [{{ 'baa'.rstrip('a') }}]")
case("m_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  '.rsplit(None, 1) }} {{ 'x'.split('x') }} {{ ''.split() }} {{ 'a\\nb\\r\\nc'.splitlines() }}")
case("m_starts_ends", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('x') }} {{ 'hello'.startswith('l', 2) }}")
case("m_case", "{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'they\\'re'.title() }} {{ 'Hello'.swapcase() }}")
case("m_find_count_replace", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'banana'.count('a') }} {{ 'banana'.count('an') }} {{ 'banana'.replace('a', 'o') }} {{ 'banana'.replace('a', 'o', 1) }} {{ 'hello'.index('e') }}")
case("m_join_format", "{{ ', '.join(['a', 'b']) }} {{ '-'.join('abc') }} {{ '{} and {}'.format('x', 'y') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{:>5}|{:<4}|{:^5}'.format('a', 'b', 'c') }} {{ '{:.2f} {:d} {:05d} {:+d}'.format(3.14159, 42, 7, 3) }} {{ '{{}}'.format() }} {{ '{!r}'.format('q') }}")
case("m_is", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ '  '.isspace() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ ''.isdigit() }}")
case("m_list", "{{ xs.index(2) }} {{ xs.count(3) }} {{ xs.copy() }} {{ (1, 2, 1).count(1) }}")
case("m_dict", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.copy() }}")
case("m_misc_str", "{{ 'a-b-c'.partition('-') }} {{ 'a-b-c'.rpartition('-') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.txt'.removesuffix('.txt') }} {{ '7'.zfill(3) }} [{{ 'ab'.ljust(4) }}] [{{ 'ab'.rjust(4, '*') }}] [{{ 'ab'.center(5, '-') }}]")
case("sandbox_unsafe_attr_prints_empty", "[{{ xs.append }}]")

# ---- real-template idioms
case("idiom_last_user_index", "{% set ns = namespace(idx=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}")
case("idiom_reverse_slice_loop", "{% for m in msgs[::-1] %}{{ (msgs|length - 1) - loop.index0 }}:{{ m.role }} {% endfor %}")
case("idiom_think_split", "{% set c = 'a<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}")
case("idiom_content_parts", "{% for m in [{'content': [{'type': 'text', 'text': 'a'}, {'type': 'image'}, {'type': 'text', 'text': 'b'}]}] %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<img>{% endif %}{% endfor %}{% endif %}{% endfor %}")
case("idiom_tool_args", "{% set args = {'city': 'Paris', 'units': ['c', 'f']} %}{% for k, v in args.items() %}<{{ k }}>{{ v if v is string else v|tojson }}</{{ k }}>{% endfor %}")
case("idiom_default_system", "{%- if msgs[0]['role'] == 'system' %}{%- set sys = msgs[0]['content'] %}{%- set rest = msgs[1:] %}{%- else %}{%- set sys = 'default' %}{%- set rest = msgs %}{%- endif %}{{ sys }}|{{ rest|length }}")

# ---- errors (the golden records that rendering must fail)
case("err_raise_exception", "line1\n{{ raise_exception('Conversation roles must alternate') }}")
case("err_unknown_filter", "{{ x|nosuchfilter }}")
case("err_unknown_test", "{{ x is nosuchtest }}")
case("err_unknown_tag", "{% frobnicate %}")
case("err_unclosed_if", "{% if true %}open")
case("err_unclosed_for", "{% for x in xs %}{{ x }}")
case("err_unexpected_end", "{% endfor %}")
case("err_bad_expression", "{{ 1 + }}")
case("err_unclosed_var", "{{ 1 + 2")
case("err_unclosed_string", "{{ 'abc }}")
case("err_unclosed_comment", "{# never closed")
case("err_unbalanced_paren", "{{ (1 + 2 }}")
case("err_undefined_attr", "{{ missing.attr }}")
case("err_undefined_item", "{{ missing['k'] }}")
case("err_undefined_call", "{{ missing() }}")
case("err_undefined_arith", "{{ missing + 1 }}")
case("err_dict_missing_key_attr", "{{ d.nope.deeper }}")
case("err_str_plus_int", "{{ 'a' + 1 }}")
case("err_div_zero", "{{ 1 / 0 }}")
case("err_floordiv_zero", "{{ 1 // 0 }}")
case("err_mod_zero", "{{ 1 % 0 }}")
case("err_not_callable", "{{ 'abc'() }}")
case("err_list_append_unsafe", "{{ xs.append(4) }}")
case("err_dict_pop_unsafe", "{{ d.pop('a') }}")
case("err_dict_update_unsafe", "{% set x = d.update({'z': 1}) %}")
case("err_tojson_undefined", "{{ missing|tojson }}")
case("err_iterate_int", "{% for x in 5 %}{% endfor %}")
case("err_iterate_none", "{% for x in nothing %}{% endfor %}")
case("err_compare_types", "{{ 1 < 'a' }}")
case("err_sort_mixed", "{{ [1, 'a']|sort }}")
case("err_range_too_big", "{{ range(1000000)|length }}")
case("err_set_non_namespace", "{% set d.x = 1 %}")
case("err_unpack_count", "{% set a, b = [1, 2, 3] %}")
case("err_items_not_mapping", "{{ xs|items|list }}")
case("err_nested_error_line", "ok\n{% for x in xs %}\n  {% if x == 2 %}\n    {{ x.foo.bar }}\n  {% endif %}\n{% endfor %}")
case("err_in_int", "{{ 1 in 2 }}")
case("err_str_index", "{{ 'abc'.index('z') }}")
case("err_neg_not_number", "{{ -'a' }}")
case("err_elif_after_else", "{% if true %}{% else %}{% elif false %}{% endif %}")
case("err_non_default_after_default", "{% macro m(a=1, b) %}{% endmacro %}")
case("err_assign_to_literal", "{% set true = 1 %}")
case("err_chained_is", "{{ 1 is odd is even }}")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "jinja", "cases.json")
with open(sys.argv[1] if len(sys.argv) > 1 else out, "w", encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False, indent=1)
    f.write("\n")
