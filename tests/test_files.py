"""Output files written whole or not at all (``simcomm.files.replacing``): a write that fails
midway (a full disk) leaves the file that was there and no temporary file behind."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import IO

import pytest

from simcomm.cli import main
from simcomm.files import replacing


def full_disk() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_a_complete_write_replaces_the_file_when_it_ends(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with replacing(target) as scratch:
        scratch.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    assert list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("old", ["old", None])
@pytest.mark.parametrize("error", [full_disk(), RuntimeError("a bug midway")])
def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_one(
        tmp_path: Path, old: str | None, error: Exception) -> None:
    target = tmp_path / "out.txt"
    if old is not None:
        target.write_text(old)
    with pytest.raises(type(error)) as caught:
        with replacing(target) as scratch:
            scratch.write_text("half of it")
            raise error
    assert list(tmp_path.iterdir()) == ([target] if old else [])
    if old:
        assert target.read_text() == old
    if isinstance(error, OSError):
        assert str(caught.value) == f"cannot write {target}: No space left on device"


def test_bench_trace_on_a_full_disk_keeps_the_old_trace_and_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # It used to leave a truncated trace in place of the old one.
    trace = tmp_path / "trace.json"
    trace.write_text("{}")

    def dump_half(data: object, stream: IO[str]) -> None:
        stream.write('{"traceEvents": [')
        raise full_disk()
    monkeypatch.setattr(json, "dump", dump_half)
    assert main(["bench", "--algorithm", "ring_allreduce", "--topology", "dgx-a100",
                 "--sizes", "1KiB", "--trace", str(trace)]) == 2
    assert capsys.readouterr().err == (f"simcomm: error: cannot write {trace}: No space left "
                                       "on device\n")
    assert trace.read_text() == "{}" and list(tmp_path.iterdir()) == [trace]
