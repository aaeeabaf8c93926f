"""`manage.py generate` as a real process, on a database that was never migrated."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run_cli(tmp_path, *args, timeout=600):
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}",
           "HF_HUB_OFFLINE": "1"}
    env.pop("REDIS_URL", None)
    return subprocess.run([sys.executable, "manage.py", "generate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_generate_json_matches_the_engine_before_any_migration(tmp_path, make_engine, tokenizer):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a red fruit 🍎"}]
    (tmp_path / "chat.json").write_text(json.dumps(messages))
    proc = run_cli(tmp_path, "--model", "smollm2-135m-instruct", "--messages-file", str(tmp_path / "chat.json"),
                   "--max-tokens", "16", "--temperature", "0", "--seed", "3", "--dtype", "float32", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"text", "token_ids", "prompt_token_ids", "usage", "finish_reason"}
    prompt = tokenizer.encode_chat(messages)
    assert result["prompt_token_ids"] == prompt
    expected = make_engine().generate([prompt], SamplingParams(temperature=0.0, max_tokens=16))[0]
    assert result["token_ids"] == expected.new_token_ids
    assert result["text"] == expected.delta_text
    assert result["usage"] == {"prompt_tokens": len(prompt), "cached_tokens": 0,
                               "completion_tokens": len(expected.new_token_ids)}
    assert result["finish_reason"] == expected.finish_reason
    # The built-in name resolved in code: the never-migrated database was not even created.
    assert not (tmp_path / "never-migrated.sqlite3").exists()


def test_generate_rejects_unknown_models_and_bad_values(tmp_path):
    proc = run_cli(tmp_path, "--model", "no-such-model", "--prompt", "hi")
    assert proc.returncode != 0 and "Unknown model 'no-such-model'" in proc.stderr
    proc = run_cli(tmp_path, "--prompt", "hi", "--temperature", "5")
    assert proc.returncode != 0 and "--temperature" in proc.stderr
