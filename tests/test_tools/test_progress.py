"""Progress bars: drawn on a terminal (stderr), silent in pipes and logs, off with --no-progress.

The tool case runs tools/generation/fid.py on two small folders of crops of
scikit-image's photographs, under a pseudo-terminal and without one.
"""
import io
import os
import os.path as osp
import pty
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, load_tool
from polaformerpp.utils.progress import NO_PROGRESS_ENV, ProgressBar, progress_enabled, track

FID_TOOL = osp.join(REPO_ROOT, 'tools', 'generation', 'fid.py')


class TerminalLike(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv(NO_PROGRESS_ENV, raising=False)


def test_bar_only_on_a_terminal():
    tty, pipe = TerminalLike(), io.StringIO()
    assert list(track(range(3), desc='counting', stream=tty)) == [0, 1, 2]
    assert list(track(range(3), desc='counting', stream=pipe)) == [0, 1, 2]
    out = tty.getvalue()
    assert out.startswith('counting\n') and '3/3' in out and '>' in out and out.endswith('\n'), out
    assert pipe.getvalue() == ''


def test_bar_can_be_forced_off_and_on(monkeypatch):
    tty = TerminalLike()
    with ProgressBar(4, enabled=False, stream=tty) as bar:
        bar.update(4)
    assert tty.getvalue() == '' and bar.completed == 4
    monkeypatch.setenv(NO_PROGRESS_ENV, '1')
    assert not progress_enabled(stream=tty)
    with ProgressBar(2, stream=tty) as bar:
        bar.update(2)
    assert tty.getvalue() == ''
    monkeypatch.setenv(NO_PROGRESS_ENV, '0')
    assert progress_enabled(stream=tty)
    pipe = io.StringIO()
    with ProgressBar(2, enabled=True, stream=pipe) as bar:  # the caller's explicit choice
        bar.update(2)
    assert '2/2' in pipe.getvalue()


def test_bar_edge_cases():
    tty = TerminalLike()
    with ProgressBar(0, 'nothing to do', stream=tty) as bar:  # no total, no bar
        bar.update(3)
    assert tty.getvalue() == ''
    assert list(track(iter('ab'), stream=tty)) == ['a', 'b'] and tty.getvalue() == ''  # no len, no bar
    with ProgressBar(2, stream=tty) as bar:
        bar.update(0)  # ignored
        bar.update(2)
    bar.close()  # closing twice ends the line once
    assert tty.getvalue().count('\n') == 1


# --------------------------------------------------------------------------- a tool
@pytest.fixture(scope='module')
def photo_folders(tmp_path_factory):
    """Two folders of 12 RGB 32x32 crops: the astronaut photograph and the cat (chelsea)."""
    from PIL import Image
    from skimage import data
    root = tmp_path_factory.mktemp('photos')
    folders = []
    for name, photo in (('astronaut', data.astronaut()), ('chelsea', data.chelsea())):
        folder = root / name
        folder.mkdir()
        small = np.asarray(Image.fromarray(photo).resize((128, 96)))
        for i in range(12):
            y, x = 16 * (i // 4), 24 * (i % 4)
            Image.fromarray(small[y:y + 32, x:x + 32]).save(folder / f'{i:02d}.png')
        folders.append(str(folder))
    return folders


def test_fid_tool_bar_in_process(photo_folders, monkeypatch, capsys):
    fid = load_tool('tools/generation/fid.py')
    argv = [*photo_folders, '--extractor', 'random-conv', '--batch-size', '4']
    fake_tty = TerminalLike()
    monkeypatch.setattr(sys, 'stderr', fake_tty)
    result = fid.main(argv)
    bar = fake_tty.getvalue()
    assert f'features of {photo_folders[0]}' in bar and '12/12' in bar, bar
    assert capsys.readouterr().out.strip() == f"FID: {result['FID']:.4f} IS: {result['IS']:.4f} " \
                                              f"IS_std: {result['IS_std']:.4f}"
    assert result['FID'] > 0
    quiet = TerminalLike()
    monkeypatch.setattr(sys, 'stderr', quiet)
    assert fid.main([*argv, '--no-progress'])['FID'] == pytest.approx(result['FID'])
    assert quiet.getvalue() == ''


def _run_with_stderr_on_pty(cmd, env):
    """Run ``cmd`` with stderr on a pseudo-terminal and stdout on a pipe; ``(rc, stdout, stderr)``."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=300), stdout, b''.join(chunks).decode(errors='replace')


@pytest.mark.slow
def test_fid_tool_bar_on_a_pseudo_terminal_and_none_in_a_pipe(photo_folders):
    env = {k: v for k, v in os.environ.items() if k != NO_PROGRESS_ENV}
    env['OMP_NUM_THREADS'] = '1'
    cmd = [sys.executable, FID_TOOL, *photo_folders, '--extractor', 'random-conv', '--batch-size', '4']
    rc, stdout, stderr = _run_with_stderr_on_pty(cmd, env)
    assert rc == 0, stderr
    assert '12/12' in stderr and f'features of {photo_folders[1]}' in stderr, stderr
    assert stdout.startswith('FID: ') and '12/12' not in stdout
    piped = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == stdout  # same result, and no bar anywhere
    assert '12/12' not in piped.stderr and 'features of' not in piped.stderr, piped.stderr


def test_sample_bar_counts_all_processes():
    """sample.py's rank-0 bar: samples made by all ranks after k batches each (rank r takes r, r+W, ...)."""
    samples_done = load_tool('tools/generation/sample.py').samples_done
    # 7 samples on 2 ranks: rank 0 makes 4 (0, 2, 4, 6), rank 1 makes 3 (1, 3, 5), batches of 2
    assert [samples_done(7, 2, 2, k) for k in (1, 2, 3)] == [4, 7, 7]
    assert samples_done(5, 1, 2, 3) == 5 and samples_done(3, 4, 8, 1) == 3  # more ranks than samples
