"""runnerctl under a locale that is not UTF-8 (a host set up with LANG=C, or ja_JP.eucJP):
files and the pipelines it writes stay UTF-8, and Japanese typed on the command line that
the locale cannot decode gets one line saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
"""A gitlab-runner started with no UTF-8 locale (Python's own UTF-8 mode and locale
coercion turned off, as in a non-UTF-8 locale such as ja_JP.eucJP): files default to ASCII."""


def _under_ascii_locale(tmp_path: Path, program: str) -> subprocess.CompletedProcess[str]:
    """`program` (UTF-8 source, so its Japanese literals are whole) run under ASCII_LOCALE."""
    script = tmp_path / "program.py"
    script.write_text(program, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], env={**os.environ, **ASCII_LOCALE},
                          capture_output=True, text=True, encoding="utf-8", timeout=120, check=False)


def test_settings_and_render_are_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """Under a locale that is not UTF-8, a valid runnerctl.toml with a Japanese comment was
    refused as "not UTF-8 text", and `render -o` wrote the pipeline in the locale's
    encoding, which GitLab cannot read (found by a review as an internationalisation
    reviewer)."""
    toml = tmp_path / "runnerctl.toml"
    toml.write_text("# 研究室のGPUサーバ\n[host]\nname = \"gpu-a\"\n", encoding="utf-8")
    out = tmp_path / "out.yml"
    done = _under_ascii_locale(tmp_path, f"""
import sys
from pathlib import Path
from runnerctl.cli import main
from runnerctl.settings import load_settings
assert load_settings(Path({str(toml)!r})).host.name == "gpu-a"
sys.exit(main(["render", "gpu-job", "-i", "job_name=学習", "-i", "command=python train.py",
               "-o", {str(out)!r}]))
""")
    assert done.returncode == 0, done
    assert "学習" in out.read_text(encoding="utf-8")


def _runnerctl_bytes(*args: bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable.encode(), b"-m", b"runnerctl", *args],
                          env={**os.environ, **ASCII_LOCALE}, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=120, check=False)


def test_japanese_on_a_command_line_the_locale_cannot_decode_is_one_line(tmp_path: Path) -> None:
    """`runnerctl pause --why ファン交換` under LANG=C: "unexpected UnicodeEncodeError ...
    please report it"; `render -i job_name=学習`: "must be one line without control
    characters" (found by a review as an internationalisation reviewer)."""
    why = "ファン交換".encode()
    (tmp_path / "none.toml").write_text("")
    done = _runnerctl_bytes(b"pause", b"--gpu", b"0", b"--host-name", b"gpu-a", b"--why", why,
                            b"--state-dir", str(tmp_path / "state").encode(),
                            b"--config", str(tmp_path / "none.toml").encode())
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        "runnerctl: error: text that is not valid utf-8 cannot be stored or shown (the locale's encoding is "
        "ANSI_X3.4-1968): run runnerctl with a UTF-8 locale, such as LANG=C.UTF-8"], done.stderr
    done = _runnerctl_bytes(b"render", b"gpu-job", b"-i", "job_name=学習".encode(), b"-i", b"command=true")
    assert done.returncode == 3 and "input 'job_name' is not valid text in this locale" in done.stderr, done
    assert "LANG=C.UTF-8" in done.stderr


def test_japanese_printed_to_a_latin1_terminal_is_one_line(tmp_path: Path) -> None:
    """`user list` with a Japanese name, printed where the output encoding is latin-1: a
    traceback (found by the final review of the session); now the one locale line."""
    store = tmp_path / "state"
    add = subprocess.run([sys.executable, "-m", "runnerctl", "user", "add", "田中", "--role", "viewer",
                          "--password-stdin", "--state-dir", str(store)], input="a long enough password 1\n",
                         capture_output=True, text=True, encoding="utf-8", timeout=120, check=False)
    assert add.returncode == 0, add
    done = subprocess.run([sys.executable, "-m", "runnerctl", "user", "list", "--state-dir", str(store)],
                          env={**os.environ, "PYTHONIOENCODING": "latin-1"}, capture_output=True, text=True,
                          encoding="latin-1", timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert done.stderr.strip().splitlines() == [
        "runnerctl: error: text that is not valid latin-1 cannot be stored or shown (the locale's encoding "
        "is UTF-8): run runnerctl with a UTF-8 locale, such as LANG=C.UTF-8"], done.stderr
