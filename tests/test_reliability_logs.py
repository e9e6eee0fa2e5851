"""Torn logs (issue 27, item 3): a kill mid-write leaves a partial metrics row or centre-log
line; resuming drops it with a warning naming the file instead of keeping garbage or failing,
and a run restarted from step 0 does not log its step-0 centres twice."""

from __future__ import annotations

import json
import logging

import pytest

from attnconv.cli import main
from attnconv.train.monitor import COLUMNS, Monitor
from tiny_runs import tiny_config


@pytest.mark.slow
def test_resume_drops_torn_metrics_rows(tmp_path, cifar_zip, capsys):
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(run))
    assert main(["train", cfg, "--stop-at-step", "2"]) == 0
    m = run / "metrics.csv"
    lines = m.read_text().splitlines()
    torn = [lines[0], lines[1][: len(lines[1]) // 2], *lines[1:], "trai"]  # torn row, torn tail
    m.write_text("\n".join(torn) + "\n")
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "metrics.csv:2: dropped a torn" in err and "'trai'" in err
    rows = m.read_text().splitlines()
    assert rows[0] == ",".join(COLUMNS)
    assert all(len(r.split(",")) == len(COLUMNS) for r in rows[1:])
    steps = [int(r.split(",")[2]) for r in rows[1:] if r.startswith("train,")]
    assert steps == sorted(steps) and steps[-1] == 4


def test_restart_from_step_zero_logs_step_zero_once(tmp_path):
    log = tmp_path / "centers.jsonl"
    log.write_text(json.dumps({"epoch": 0, "step": 0, "layers": [[[0.0, 0.0]]]}) + "\n")
    (tmp_path / "metrics.csv").write_text(",".join(COLUMNS) + "\n")
    Monitor(tmp_path, enabled=True, resume_step=0, progress=False, tensorboard=False, total_steps=4)
    assert not log.exists()  # the restarted run logs its own step 0


def test_resume_drops_torn_centre_lines(tmp_path, caplog):
    log = tmp_path / "centers.jsonl"
    good = [json.dumps({"epoch": e, "step": 2 * e, "layers": [[[0.0, 0.0]]]}) for e in range(3)]
    log.write_text(good[0] + "\n" + good[1][:10] + "\n" + good[1] + "\n" + good[2] + "\n")
    with caplog.at_level(logging.WARNING):
        Monitor(
            tmp_path, enabled=True, resume_step=2, progress=False, tensorboard=False, total_steps=4
        )
    assert log.read_text().splitlines() == good[:2]
    assert "centers.jsonl:2: dropped a torn" in caplog.text


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_with_non_finite_weights(tmp_path, cifar_zip, capsys):
    """A crafted checkpoint (hashes recomputed) holding NaN weights is never resumed from, so
    it is never named "last good" when the first step then fails."""
    import hashlib

    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    from attnconv.train import checkpoint as ck

    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(run))
    assert main(["train", cfg, "--stop-at-step", "2"]) == 0
    step = ck.follow_latest(run / "checkpoints")
    w = st_load((step / ck.WEIGHTS).read_bytes())
    name = next(k for k, t in w.items() if t.is_floating_point())
    w[name][...] = float("nan")
    data = st_save(w)
    (step / ck.WEIGHTS).write_bytes(data)
    meta = json.loads((step / ck.META).read_text())
    meta["files"][ck.WEIGHTS] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    meta[ck.META_HASH] = ck.meta_digest(meta)
    (step / ck.META).write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "non-finite weights" in err and name in err and "last good" not in err


def _trainer(tmp_path, cifar_zip, epochs: int):
    from attnconv.train.config import load_config
    from attnconv.train.loop import Trainer

    run = tmp_path / "run"
    cfg = load_config(tiny_config(tmp_path, cifar_zip, epochs=epochs, out_dir=str(run)))
    cfg.train.eval_batch_size = 2  # 10 test images: 5 eval batches
    return Trainer(cfg)


@pytest.mark.slow
def test_signal_during_evaluation_stops_it(tmp_path, cifar_zip):
    """SIGTERM / SIGINT while evaluating stops at the next batch (not after the whole split):
    a resumable checkpoint, a 'stopped by' line, no eval row for the cut evaluation."""
    import signal

    from attnconv.train.loop import Interrupted

    tr = _trainer(tmp_path, cifar_zip, epochs=2)
    batches, seen = tr.eval_loader.batches, []

    def signalled(epoch, *a):
        for i, b in enumerate(batches(epoch, *a)):
            seen.append(i)
            if i == 0:
                tr.stop_signal = signal.SIGTERM  # arrives during the first eval batch
            yield b

    tr.eval_loader.batches = signalled
    with pytest.raises(Interrupted):
        tr.fit()
    assert seen == [0]  # the second batch was never evaluated
    rows = (tr.out / "metrics.csv").read_text().splitlines()
    assert not any(r.startswith("eval,") for r in rows)
    assert (tr.ckdir / "step-00000002").is_dir()  # resumable at the epoch's end


@pytest.mark.slow
def test_signal_in_the_last_epoch_is_not_swallowed(tmp_path, cifar_zip):
    import signal

    from attnconv.train.loop import Interrupted

    tr = _trainer(tmp_path, cifar_zip, epochs=1)
    save = tr.save

    def save_then_signal():
        path = save()
        if tr.step == tr.total:
            tr.stop_signal = signal.SIGINT  # arrives during the final save
        return path

    tr.save = save_then_signal
    with pytest.raises(Interrupted):
        tr.fit()


@pytest.mark.slow
def test_reader_survives_a_pruned_step_folder(tmp_path, cifar_zip, monkeypatch):
    """load_model beside a training that prunes (keep_checkpoints 1): the step folder it
    resolved disappears before it is read; it reads the one `latest` names now, never a bare
    [Errno 2]."""
    import shutil

    from attnconv.loading import checkpoint as ck

    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=2, out_dir=str(run))
    assert main(["train", cfg, "--stop-at-step", "2"]) == 0
    real, calls = ck.find_checkpoint, []

    def pruned_after_resolving(path):
        d = real(path)
        calls.append(d)
        if len(calls) == 1:  # the training saves step 3 and prunes this one right now
            shutil.copytree(d, d.with_name("step-00000003"))
            (d.parent / "latest").write_text("step-00000003")
            shutil.rmtree(d)
        return d

    monkeypatch.setattr(ck, "find_checkpoint", pruned_after_resolving)
    model, meta = ck.load_model(run)
    assert calls[0].name == "step-00000002" and calls[-1].name == "step-00000003"
    assert meta["path"].endswith("step-00000003")


@pytest.mark.slow
def test_resuming_a_finished_run_says_so(tmp_path, cifar_zip, capsys):
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=1, out_dir=str(run))
    assert main(["train", cfg]) == 0
    capsys.readouterr()
    assert main(["train", cfg, "--resume"]) == 0
    assert "already finished: nothing left to train" in capsys.readouterr().err


@pytest.mark.slow
def test_metrics_seconds_go_on_over_a_resume(tmp_path, cifar_zip):
    """metrics.csv's ``seconds`` is the run's training time: a resume goes on from the clock its
    checkpoint saved (it restarted at 0 each sitting)."""
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, cifar_zip, epochs=3, out_dir=str(run))
    assert main(["train", cfg, "--stop-at-step", "2"]) == 0
    meta = json.loads((run / "checkpoints" / "step-00000002" / "checkpoint.json").read_text())
    saved = meta["state"]["seconds"]
    assert saved > 0
    assert main(["train", cfg, "--resume"]) == 0
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    seconds = [float(r.split(",")[-1]) for r in rows]
    steps = [int(r.split(",")[2]) for r in rows]
    assert seconds == sorted(seconds)
    assert all(s + 0.05 >= saved for s, n in zip(seconds, steps) if n > 2)  # rows: 0.1 s
    meta = json.loads((run / "checkpoints" / "step-00000006" / "checkpoint.json").read_text())
    assert meta["state"]["seconds"] >= seconds[-1] - 1.0
