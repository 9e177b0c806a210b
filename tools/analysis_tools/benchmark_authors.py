"""The project's classifier against the authors' code at equal weights: inference and training steps.

``--reference`` is a Python file with the authors' classifier in their
layout and names: it must define ``authors_model(arch, seed)`` returning it
(an ``nn.Module`` taking ``(B, 3, H, W)`` images, giving logits). The
repository's ``tests/test_models/authors_reference.py`` is such a file, an
independent re-implementation with the authors' conventions. Its state dict
is converted with the project's converter and loaded into the classifier of
``--config`` (mmpretrain's ``ImageClassifier``), whose logits are checked
against the reference's before anything is timed.

Timed per step, interleaved (one round runs every model once; medians over
``--rounds``): inference (``no_grad``, eval mode, logits) and training
(train mode, logits, cross-entropy, backward, AdamW step; stochastic depth
off in both networks, since the reference has none). Random images of
``--shape``, ``--batch-size`` per step.

Example::

    python tools/analysis_tools/benchmark_authors.py configs/classification/polapp-b2_8xb256_in1k.py \\
        --reference tests/test_models/authors_reference.py --batch-size 8 --threads 2
"""
import argparse
import importlib.util
import json
import os.path as osp
import statistics
import time

import torch
import torch.nn.functional as F
from mmengine.config import Config

from polaformerpp.analysis import load_model
from polaformerpp.models.backbones.polaformerpp_convert import convert_official_state_dict
from polaformerpp.utils.cli import ArgumentCheckError, image_shape, parser_errors, positive_int, run_cli

#: the largest relative logit difference accepted as "equal weights"
LOGIT_TOLERANCE = 1e-4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Time the project's classifier against the authors' code")
    parser.add_argument('config', help='classification config (its backbone arch is the one compared)')
    parser.add_argument('--reference', required=True,
                        help="Python file defining authors_model(arch, seed), the authors' classifier")
    parser.add_argument('--shape', type=int, nargs='+', default=[224], help='input H W (or one size)')
    parser.add_argument('--batch-size', type=positive_int, default=8)
    parser.add_argument('--rounds', type=positive_int, default=10, help='timed rounds (after one warm-up)')
    parser.add_argument('--threads', type=positive_int, default=None, help='CPU threads (torch.set_num_threads)')
    parser.add_argument('--steps', nargs='+', choices=('inference', 'train'), default=['inference', 'train'])
    parser.add_argument('--out-json', help='write the measurements to this JSON file')
    args = parser.parse_args(argv)
    with parser_errors(parser):
        args.shape = image_shape(args.shape)
        if not osp.isfile(args.config):
            raise ArgumentCheckError(f'config: {args.config} not found')
        if not osp.isfile(args.reference):
            raise ArgumentCheckError(f'--reference: {args.reference} not found')
    return args


def load_reference(path):
    """The ``authors_model`` function of the file at ``path``."""
    spec = importlib.util.spec_from_file_location('polapp_authors_reference', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, 'authors_model', None)):
        raise ArgumentCheckError(f'--reference: {path} defines no authors_model(arch, seed)')
    return module.authors_model


def build_pair(config, reference_path):
    """``(ours, theirs, arch)``: the config's classifier carrying the reference's converted weights."""
    cfg = Config.fromfile(config)
    backbone = cfg.model.backbone
    arch = backbone.get('arch', 'b0')
    if not isinstance(arch, str):
        raise ArgumentCheckError('config: the comparison needs a zoo arch name (b0-b5) as model.backbone.arch')
    backbone.update(drop_path_rate=0.0, init_cfg=None)
    theirs = load_reference(reference_path)(arch, 0)
    state_dict, report = convert_official_state_dict(theirs.state_dict())
    if not report.ok:
        raise ArgumentCheckError(f'--reference: its state dict does not convert cleanly:\n{report}')
    ours = load_model(cfg)
    ours.load_state_dict(state_dict, strict=True)
    return ours, theirs, arch


def check_equal_logits(ours, theirs, images):
    with torch.no_grad():
        mine, ref = ours(images, mode='tensor'), theirs(images)
    err = ((mine - ref).abs().max() / ref.abs().max()).item()
    if not err < LOGIT_TOLERANCE:
        raise RuntimeError(f'the classifiers disagree (max relative logit difference {err:.3g}): '
                           f'the weights are not equal')
    return err


def make_steps(model, images, labels, logits):
    """``{'inference': f, 'train': f}`` for one model (``logits(model, images)``)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def inference():
        model.eval()
        with torch.no_grad():
            logits(model, images)

    def train():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(logits(model, images), labels).backward()
        optimizer.step()

    return dict(inference=inference, train=train)


def interleaved_medians(steps, rounds):
    """``{name: median seconds}``: one untimed call each, then ``rounds`` rounds calling every step once."""
    times = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def benchmark_authors(config, reference, shape=(224, 224), batch_size=8, rounds=10,
                      steps=('inference', 'train')):
    """Median step times (s) of both classifiers and the speed-ups ``theirs / ours`` per step."""
    ours, theirs, arch = build_pair(config, reference)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, *shape, generator=gen)
    labels = torch.randint(0, 1000, (batch_size, ), generator=gen) % ours.head.fc.out_features
    err = check_equal_logits(ours, theirs, images)
    mine = make_steps(ours, images, labels, lambda m, x: m(x, mode='tensor'))
    ref = make_steps(theirs, images, labels, lambda m, x: m(x))
    result = dict(config=config, arch=arch, batch_size=batch_size, shape=list(shape),
                  threads=torch.get_num_threads(), rounds=rounds, logit_rel_err=err)
    for name in steps:
        medians = interleaved_medians({'ours': mine[name], 'authors': ref[name]}, rounds)
        result[name] = dict(ours_s=medians['ours'], authors_s=medians['authors'],
                            speedup=medians['authors'] / medians['ours'])
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = benchmark_authors(args.config, args.reference, args.shape, args.batch_size, args.rounds, args.steps)
    print(f"{result['arch']}, batch {args.batch_size}, {args.shape[0]}x{args.shape[1]}, cpu "
          f"({result['threads']} threads), equal weights (logits within {result['logit_rel_err']:.1e}), "
          f"median of {args.rounds} interleaved rounds")
    for name in args.steps:
        r = result[name]
        print(f"{name:>9}: ours {r['ours_s'] * 1e3:8.1f} ms   authors' {r['authors_s'] * 1e3:8.1f} ms   "
              f"speed-up {r['speedup']:.2f}x")
    if args.out_json:
        with open(args.out_json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    run_cli(main)
