#!/usr/bin/env bash
# Regenerates the Jinja golden files in tests/fixtures/jinja/ with the reference (Debian's python3-jinja2,
# configured as transformers configures it). Needs node_modules (scripts/install-deps) for the chat cases.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
fx=tests/fixtures/jinja
$py tools/jinja/make_cases.py "$fx/cases.json"
$py tools/jinja/make_chat_cases.py "$fx/chat_cases.json"
$py tools/jinja/render_reference.py "$fx/cases.json" "$fx/expected.json"
$py tools/jinja/render_reference.py "$fx/chat_cases.json" "$fx/chat_expected.json"
echo "wrote $fx/{cases,expected,chat_cases,chat_expected}.json"
