"""The web process stays torch-free: its modules, and the engine modules it uses per request, load no torch.

The web side tokenizes, renders the chat template and validates sampling parameters with the engine's
own code (inference.engine.tokenizer, chat_template, registry, sampling_params), which reads a GGUF's
header and never its tensors. Importing torch there would cost every web replica seconds at start and
hundreds of MB. In embedded mode the engine does run in the web process: its thread loads torch when it
starts (the first request), never at import. The static half of this is import-linter's "web-torch-free"
contract (pyproject.toml); this test checks what a fresh process really loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "kernels")

SCRIPT = r"""
import importlib, json, pkgutil, sys

import django

django.setup()

import inference.api

modules = ["inference.api." + info.name for info in pkgutil.iter_modules(inference.api.__path__)] + [
    "inference.views", "inference.urls", "inference.consumers", "inference.routing", "inference.selectors",
    "inference.bootstrap", "inference.serving", "inference.protocol", "inference.channel_layer",
    "platform_site.urls", "platform_site.asgi",
]
for name in modules:
    importlib.import_module(name)
loaded = {"import": sorted(m for m in HEAVY if m in sys.modules)}

# what a request does with the engine's modules: resolve the model, tokenize with its chat template,
# validate its sampling parameters and its response_format
from django.conf import settings

from inference.engine.sampling_params import SamplingParams
from inference.engine.tokenizer import load_tokenizer

tokenizer = load_tokenizer(settings.DEFAULT_MODEL)
assert tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
params = SamplingParams(max_tokens=8, temperature=0.5, top_p=0.9)
params.validate(vocab_size=tokenizer.vocab_size)
# a response_format's schema checked the way the web checks it (inference.api.response_format: llguidance)
from inference.engine.structured_spec import StructuredOutput, check

check(StructuredOutput("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}}, True))
loaded["request"] = sorted(m for m in HEAVY if m in sys.modules)
print(json.dumps(loaded))
"""


def _embedded_env() -> dict[str, str]:
    """This environment with the embedded defaults: no database or Redis URL, the engine in-process."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "EMBEDDED_WORKER"}}
    env.update(DJANGO_SETTINGS_MODULE="platform_site.settings", DEBUG="1", ENV_FILE=os.devnull,
               PYTHONPATH=str(ROOT))
    return env


def test_the_web_modules_and_a_requests_tokenizing_load_no_torch():
    result = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + SCRIPT], cwd=ROOT, env=_embedded_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == {"import": [], "request": []}, loaded
