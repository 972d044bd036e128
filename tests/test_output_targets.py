"""Where ``-o`` writes (issue 36 item 1): omni_pd/io.py ``atomic_write`` renames a temp
file over a regular file or a new path only. A character device or a FIFO is written
through (opened and written, never replaced); ``/dev/stdout`` and ``/dev/stderr`` (and a
link to ``/proc/self/fd/1``) are this process's own streams; a symbolic link is followed
to the file it names, which is replaced atomically while the link stays; a dangling link
and a block device are refused (OPD005). Every writer goes through it: expand -o, graph
-o, schema -o, migrate -o, size --write/--record, render's files, launch's reports."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "fixtures" / "legacy_seed_pd_recipe.yaml"
SIZING = ROOT / "tests" / "fixtures" / "sizing"
SIZE = ["size", "--model-info", str(SIZING / "qwen3_omni_config.json"), "--system", "h200_sxm",
        "--total-devices", "9", "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480",
        "--output-tokens", "500", "--ttft", "1000", "--tpot", "30",
        "--from-result", str(SIZING / "aic_qwen3_30b_a3b_h200_vllm.json"), "--format", "json"]

#: each writer: argv with OUT where the output path goes
WRITERS = {
    "expand": ["expand", "-q", "-o", "OUT"],
    "graph": ["graph", "--format", "mermaid", "-o", "OUT"],
    "schema": ["schema", "-o", "OUT"],
    "migrate": ["migrate", "-q", str(SEED), "-o", "OUT"],
    "size --write": SIZE + ["--write", "OUT"],
}


def run(args: list[str], capsys) -> tuple[int, str, str]:
    """``(rc, out, err)``; migrate's rc 1 (the seed migrates to a file validate refuses,
    OPD404: written all the same) is reported as 0, every other rc as it is."""
    rc = main(args)
    out, err = capsys.readouterr()
    if args[0] == "migrate" and rc == 1 and "validate finds 1 error" in err:
        rc = 0
    return rc, out, err


def with_out(argv: list[str], out: Path | str) -> list[str]:
    return [str(out) if a == "OUT" else a for a in argv]


def stdout_text(name: str, capsys, tmp_path: Path) -> str:
    """What the writer ``name`` writes to a new regular file (the reference)."""
    ref = tmp_path / f"ref-{name.replace(' ', '_')}.txt"
    rc, _, err = run(with_out(WRITERS[name], ref), capsys)
    assert rc == 0, err
    return ref.read_text()


def char_device(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot mknod here: {e}")


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_character_device_is_written_through_never_replaced(name, tmp_path, capsys):
    dev = tmp_path / "null"
    char_device(dev)
    rc, _, err = run(with_out(WRITERS[name], dev), capsys)
    assert rc == 0, err
    st = os.lstat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temp file left


@pytest.mark.parametrize("name", ["expand", "graph", "schema", "migrate"])
def test_a_fifo_gets_the_text_and_stays_a_fifo(name, tmp_path, capsys):
    want = stdout_text(name, capsys, tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    rc, _, err = run(with_out(WRITERS[name], fifo), capsys)
    t.join(timeout=10)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not t.is_alive() and got == [want.encode()]


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_symlink_is_followed_its_target_replaced_and_the_link_kept(name, tmp_path, capsys):
    want = stdout_text(name, capsys, tmp_path)
    real = tmp_path / "real" / "deploy.out"
    real.parent.mkdir()
    real.write_text("old\n")
    real.chmod(0o600)
    link = tmp_path / "link.out"
    link.symlink_to(Path("real") / "deploy.out")  # relative, as ln -s writes it
    rc, _, err = run(with_out(WRITERS[name], link), capsys)
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == "real/deploy.out"
    assert real.read_text() == want
    assert stat.S_IMODE(real.stat().st_mode) == 0o600  # the file's mode is kept
    assert f"{link} is a symbolic link: wrote the file it points to, {real} (the link is kept)\n" in err
    assert sorted(p.name for p in real.parent.iterdir()) == ["deploy.out"]


def test_a_chain_of_links_is_followed_to_the_file(tmp_path, capsys):
    real = tmp_path / "real.yaml"
    real.write_text("old\n")
    (tmp_path / "b.yaml").symlink_to(real)
    (tmp_path / "a.yaml").symlink_to("b.yaml")
    rc, out, err = run(["expand", "-q", "-o", str(tmp_path / "a.yaml")], capsys)
    assert rc == 0, err
    assert (tmp_path / "a.yaml").is_symlink() and (tmp_path / "b.yaml").is_symlink()
    assert real.read_text().startswith("# ")


def test_a_dangling_symlink_is_refused_and_left_alone(tmp_path, capsys):
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "missing" / "out.yaml")
    rc, out, err = run(["expand", "-q", "-o", str(link)], capsys)
    assert rc == 2
    assert (f"error[OPD005]: cannot write output: {link} is a symbolic link to "
            f"{tmp_path / 'missing' / 'out.yaml'}, which does not exist\n") in err
    assert ("  = help: create the file it points to first, or remove the link: omni-pd writes through a "
            "link only to an existing file\n") in err
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "missing" / "out.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml"]


def test_a_block_device_is_refused(tmp_path, capsys):
    dev = tmp_path / "disk"
    try:
        os.mknod(dev, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot mknod here: {e}")
    rc, _, err = run(["expand", "-q", "-o", str(dev)], capsys)
    assert rc == 2
    assert f"error[OPD005]: cannot write output: {dev} is a block device\n" in err
    assert stat.S_ISBLK(os.lstat(dev).st_mode)


def test_dev_stdout_is_this_process_stdout(tmp_path, capsys):
    want = stdout_text("expand", capsys, tmp_path)
    before = os.lstat("/dev/stdout")
    rc, out, err = run(["expand", "-q", "-o", "/dev/stdout"], capsys)
    assert rc == 0, err
    assert out == want
    after = os.lstat("/dev/stdout")
    assert stat.S_ISLNK(after.st_mode) and after.st_ino == before.st_ino


def test_a_link_to_proc_self_fd_1_is_stdout_not_a_file_to_replace(tmp_path, capsys):
    want = stdout_text("graph", capsys, tmp_path)
    link = tmp_path / "out"
    link.symlink_to("/proc/self/fd/1")
    rc, out, err = run(["graph", "--format", "mermaid", "-o", str(link)], capsys)
    assert rc == 0, err
    assert out == want
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_atomic_write_unit_regular_file_new_and_replaced(tmp_path):
    from omni_pd.io_write import atomic_write

    p = tmp_path / "x.txt"
    atomic_write(p, "one\n")
    assert p.read_text() == "one\n" and stat.S_IMODE(p.stat().st_mode) == 0o644
    p.chmod(0o640)
    ino = p.stat().st_ino
    atomic_write(p, "two\n")
    assert p.read_text() == "two\n" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert p.stat().st_ino != ino  # replaced by rename: a reader never sees half a file
    assert sorted(q.name for q in tmp_path.iterdir()) == ["x.txt"]
