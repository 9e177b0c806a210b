"""Reproduce the model-zoo tables: evaluate checkpoints and compare with the published numbers.

For every selected model this runs ``tools/test.py CONFIG CHECKPOINT`` (or
``tools/dist_test.sh`` with ``--gpus N``) in its own process, reads the
metrics it writes (``--out-json``) and prints one table: for each published
metric the published value, the measured one and ``measured - published``.

Which models, checkpoints and published numbers:

* from the model index (default): every model of the metafiles listed in
  ``model-index.yml`` (``--models`` picks some by name, shell patterns
  allowed); its published numbers are the metafile's ``Results``; its
  checkpoint is ``Weights`` when that is a local file, else
  ``--checkpoint-dir/<Name>.pth`` or ``--checkpoint-dir/<file name of Weights>``;
  models without a checkpoint are listed as such;
* or from ``--list FILE`` (YAML or JSON), a list of entries::

      - config: configs/classification/polapp-b0_8xb256_in1k.py
        checkpoint: checkpoints/polapp-b0_in1k.pth
        name: polapp-b0_8xb256_in1k           # optional; default: the config's name
        results:                              # optional; default: the metafile's Results
          - {Dataset: ImageNet-1k, Metrics: {Top 1 Accuracy: 76.9}}
        cfg_options: [test_dataloader.batch_size=64]   # optional, passed to tools/test.py

Metric names follow the metafiles (``Top 1 Accuracy``, ``box AP``,
``mask AP``, ``mIoU``, ``PSNR``/``SSIM`` per dataset, ``FID``) and are
matched to the evaluators' keys (``accuracy/top1``, ``coco/bbox_mAP`` x 100,
``<dataset>/PSNR``, ``gen/FID``, ...); a metric named like an evaluator key is
used as is.

Examples::

    python tools/model_zoo/check_results.py --checkpoint-dir checkpoints --models 'polapp-b*_in1k'
    python tools/model_zoo/check_results.py --list my_runs.yml --gpus 8 --out results.md
    python tools/model_zoo/check_results.py --dry-run          # what would run

While the evaluations run, a progress bar over the checkpoints goes to stderr
when it is a terminal (``--no-progress`` or ``POLAPP_NO_PROGRESS=1``: none; in
logs a line per model instead); the table goes to stdout.
"""
import argparse
import fnmatch
import json
import os
import os.path as osp
import subprocess
import sys

import yaml

from polaformerpp.utils.checkpoint import ALLOW_PARTIAL_HELP, UNSAFE_LOAD_HELP
from polaformerpp.utils.cli import (
    ArgumentCheckError,
    MissingPathError,
    existing_file,
    parser_errors,
    positive_int,
    run_cli,
)
from polaformerpp.utils.progress import ProgressBar, add_progress_argument, progress_enabled, progress_from_args

REPO_ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))

# metafile metric name (lower case) -> evaluator keys to try, with the factor to the metafile's unit
METRIC_KEYS = {
    'top 1 accuracy': [('accuracy/top1', 1.0)],
    'top 5 accuracy': [('accuracy/top5', 1.0)],
    'box ap': [('coco/bbox_mAP', 100.0)],
    'mask ap': [('coco/segm_mAP', 100.0)],
    'miou': [('mIoU', 1.0)],
    'aacc': [('aAcc', 1.0)],
    'psnr': [('{dataset}/PSNR', 1.0), ('PSNR', 1.0)],
    'ssim': [('{dataset}/SSIM', 1.0), ('SSIM', 1.0)],
    'fid': [('gen/FID', 1.0), ('FID', 1.0)],
    'is': [('gen/IS', 1.0), ('IS', 1.0)],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Evaluate model-zoo checkpoints and compare with the '
                                     'published results')
    parser.add_argument('--model-index', default=osp.join(REPO_ROOT, 'model-index.yml'),
                        help='model index whose metafiles list the models (default: the repo\'s)')
    parser.add_argument('--models', nargs='+', default=None, help='model names (shell patterns) to check')
    parser.add_argument('--list', dest='list_file', help='YAML/JSON list of {config, checkpoint, ...}')
    parser.add_argument('--checkpoint-dir', default='checkpoints', help='where <Name>.pth files are')
    parser.add_argument('--work-dir', default='work_dirs/model_zoo', help='logs and metrics per model')
    parser.add_argument('--gpus', type=positive_int, default=1,
                        help='> 1: tools/dist_test.sh with this many GPUs')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='passed to every tools/test.py run, e.g. test_dataloader.batch_size=64')
    parser.add_argument('--unsafe-load', action='store_true',
                        help='passed on to tools/test.py: ' + UNSAFE_LOAD_HELP)
    parser.add_argument('--allow-partial', action='store_true',
                        help='passed on to tools/test.py: ' + ALLOW_PARTIAL_HELP)
    parser.add_argument('--dry-run', action='store_true',
                        help='print the commands and the table, run nothing')
    parser.add_argument('--out', help='also write the table to this .md or .json file')
    add_progress_argument(parser)
    args = parser.parse_args(argv)
    with parser_errors(parser):
        if args.list_file:
            existing_file(args.list_file, '--list')
        elif not osp.isfile(args.model_index):
            raise MissingPathError(f'--model-index: {args.model_index} not found (or pass --list)')
    return args


# --------------------------------------------------------------------------- what to check
def _read_yaml_or_json(path):
    with open(path) as f:
        return json.load(f) if path.endswith('.json') else yaml.safe_load(f)


def _repo_path(path):
    """An absolute path: as given if it exists from here, else relative to the repo root."""
    if osp.isabs(path) or osp.exists(path):
        return osp.abspath(path)
    return osp.join(REPO_ROOT, path)


def load_metafile_models(model_index):
    """All ``Models`` entries of the metafiles the index imports (each with its ``_metafile``)."""
    index = _read_yaml_or_json(model_index) or {}
    models = []
    for metafile in index.get('Import') or []:
        path = osp.join(osp.dirname(osp.abspath(model_index)), metafile)
        if not osp.isfile(path):
            raise FileNotFoundError(f'{model_index} imports {metafile}, which does not exist')
        for model in (_read_yaml_or_json(path) or {}).get('Models') or []:
            models.append(dict(model, _metafile=metafile))
    return models


def _config_key(config):
    return osp.normpath(osp.relpath(_repo_path(config), REPO_ROOT))


def find_checkpoint(model, checkpoint_dir):
    """``Weights`` if it is a local file, else ``<dir>/<Name>.pth`` or ``<dir>/<file name of Weights>``."""
    weights = model.get('Weights')
    if weights and osp.isfile(_repo_path(weights)):
        return _repo_path(weights)
    candidates = [f"{model['Name']}.pth"]
    if weights:
        candidates.append(osp.basename(str(weights).split('?')[0]))
    for name in candidates:
        path = osp.join(checkpoint_dir, name)
        if osp.isfile(path):
            return path
    return None


def entries_from_index(models, patterns, checkpoint_dir):
    entries = []
    for model in models:
        if patterns and not any(fnmatch.fnmatch(model['Name'], p) for p in patterns):
            continue
        entries.append(dict(name=model['Name'], config=model['Config'],
                            checkpoint=find_checkpoint(model, checkpoint_dir),
                            results=model.get('Results') or [], cfg_options=[]))
    if patterns and not entries:
        raise ArgumentCheckError(f'--models: no model of the index matches {patterns}')
    return entries


def entries_from_list(path, models):
    """Entries of a ``--list`` file; published results default to the metafile model of that config/name."""
    items = _read_yaml_or_json(path)
    if not isinstance(items, list) or not items:
        raise ValueError(f'{path} must hold a non-empty list of {{config, checkpoint, ...}} entries')
    by_name = {m['Name']: m for m in models}
    by_config = {_config_key(m['Config']): m for m in models if m.get('Config')}
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or 'config' not in item or 'checkpoint' not in item:
            raise ValueError(f'{path}: entry {i} needs "config" and "checkpoint", got {item!r}')
        name = item.get('name') or osp.splitext(osp.basename(item['config']))[0]
        known = by_name.get(name) or by_config.get(_config_key(item['config'])) or {}
        entries.append(dict(name=name, config=item['config'], checkpoint=item['checkpoint'],
                            results=item.get('results', known.get('Results')) or [],
                            cfg_options=list(item.get('cfg_options') or [])))
    return entries


# --------------------------------------------------------------------------- running
def build_test_command(entry, work_dir, gpus, cfg_options, unsafe_load=False, allow_partial=False):
    out_json = osp.join(work_dir, 'metrics.json')
    options = ['--work-dir', work_dir, '--out-json', out_json]
    options += ['--unsafe-load'] * bool(unsafe_load) + ['--allow-partial'] * bool(allow_partial)
    overrides = [*cfg_options, *entry['cfg_options']]
    if overrides:
        options += ['--cfg-options', *overrides]
    config, checkpoint = _repo_path(entry['config']), osp.abspath(entry['checkpoint'])
    if gpus > 1:
        return ['bash', osp.join(REPO_ROOT, 'tools', 'dist_test.sh'), config, checkpoint, str(gpus), *options]
    return [sys.executable, osp.join(REPO_ROOT, 'tools', 'test.py'), config, checkpoint, *options]


def refusal_in_log(log):
    """tools/test.py's refusal of a checkpoint (unsafe to unpickle, or not fitting the model) in ``log``."""
    with open(log, errors='replace') as f:
        for line in f:
            if 'error: refusing to load checkpoint' in line or ('error: checkpoint' in line
                                                                  and 'does not fit the model' in line):
                return line.split('error: ', 1)[1].strip()
    return None


def run_test(entry, work_dir, gpus, cfg_options, unsafe_load=False, allow_partial=False):
    """Run the evaluation; returns ``(metrics dict or None, status)``.

    A checkpoint tools/test.py refuses gets the status ``refused: <its message>``.
    """
    os.makedirs(work_dir, exist_ok=True)
    cmd = build_test_command(entry, work_dir, gpus, cfg_options, unsafe_load, allow_partial)
    env = dict(os.environ, PYTHON=sys.executable)
    log = osp.join(work_dir, 'test.log')
    with open(log, 'w') as f:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    metrics_file = cmd[cmd.index('--out-json') + 1]
    if proc.returncode != 0 or not osp.isfile(metrics_file):
        refusal = refusal_in_log(log)
        if refusal:
            return None, f'refused: {refusal}'
        return None, f'failed (exit {proc.returncode}, see {log})'
    with open(metrics_file) as f:
        return json.load(f), 'ok'


# --------------------------------------------------------------------------- comparing
def measured_value(metrics, metric, dataset=None, single_dataset=True):
    """The evaluator's value for a metafile metric, in the metafile's unit; ``(key, value)`` or None.

    With several test sets (``single_dataset=False``) only a set's own entry
    (``<dataset>/<metric>``) counts, never the mean over the sets.
    """
    if dataset and f'{dataset}/{metric}' in metrics:
        return f'{dataset}/{metric}', float(metrics[f'{dataset}/{metric}'])
    aliases = METRIC_KEYS.get(metric.lower(), [])
    per_dataset = any('{dataset}' in template for template, _ in aliases)
    if not single_dataset and per_dataset:
        aliases = [(t, f) for t, f in aliases if '{dataset}' in t]
    for template, factor in aliases:
        if '{dataset}' in template and not dataset:
            continue
        key = template.format(dataset=dataset)
        if key in metrics:
            return key, float(metrics[key]) * factor
    if metric in metrics and (single_dataset or not per_dataset):
        return metric, float(metrics[metric])
    suffix = [k for k in metrics if k.endswith('/' + metric)]
    if single_dataset and len(suffix) == 1:
        return suffix[0], float(metrics[suffix[0]])
    return None


def _fmt(value, signed=False):
    if value is None:
        return '—'
    digits = 4 if abs(value) < 1 else 2
    return f'{value:+.{digits}f}' if signed else f'{value:.{digits}f}'


def table_rows(entry, metrics, status):
    """One row per published metric (or one status row when there is nothing to compare)."""
    results = [r for r in entry['results'] if isinstance(r, dict)]
    datasets = {r.get('Dataset') for r in results}
    rows = []
    for result in results:
        for metric, published in (result.get('Metrics') or {}).items():
            row = dict(model=entry['name'], dataset=result.get('Dataset') or '—', metric=metric,
                       published=None if published is None else float(published), measured=None,
                       diff=None, key=None, status=status)
            if metrics is not None:
                found = measured_value(metrics, metric, result.get('Dataset'), len(datasets) <= 1)
                if found is None:
                    row['status'] = 'metric not in the evaluation'
                else:
                    row['key'], row['measured'] = found
                    if row['published'] is not None:
                        row['diff'] = row['measured'] - row['published']
            rows.append(row)
    if not rows:  # nothing published: show what was measured
        for key, value in (metrics or {}).items():
            if isinstance(value, (int, float)):
                rows.append(dict(model=entry['name'], dataset='—', metric=key, published=None,
                                 measured=float(value), diff=None, key=key, status=status))
        if not rows:
            rows.append(dict(model=entry['name'], dataset='—', metric='—', published=None, measured=None,
                             diff=None, key=None, status=status))
    return rows


def format_table(rows):
    header = ['model', 'dataset', 'metric', 'published', 'measured', 'diff', 'status']
    lines = [[r['model'], str(r['dataset']), r['metric'], _fmt(r['published']), _fmt(r['measured']),
              _fmt(r['diff'], signed=True), r['status']] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return '| ' + ' | '.join(c.rjust(w) if 3 <= i <= 5 else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + ' |'

    # numbers right-aligned (markdown ':' on the right of their separator)
    separator = '|' + '|'.join('-' * (w + 1) + (':' if 3 <= i <= 5 else '-')
                               for i, w in enumerate(widths)) + '|'
    return '\n'.join([fmt(header), separator] + [fmt(line) for line in lines])


def main(argv=None):
    args = parse_args(argv)
    models = load_metafile_models(args.model_index) if osp.isfile(args.model_index) else []
    if args.list_file:
        entries = entries_from_list(args.list_file, models)
    else:
        if not models:
            raise FileNotFoundError(f'no models: {args.model_index} is missing or empty (or pass --list)')
        entries = entries_from_index(models, args.models, args.checkpoint_dir)

    rows = []
    runnable = 0 if args.dry_run else sum(bool(e['checkpoint']) and osp.isfile(e['checkpoint'])
                                          for e in entries)
    show = progress_enabled(progress_from_args(args))
    with ProgressBar(runnable, f'evaluating {runnable} checkpoint(s)', enabled=show) as bar:
        for i, entry in enumerate(entries, 1):
            work_dir = osp.abspath(osp.join(args.work_dir, entry['name']))
            if not entry['checkpoint']:
                metrics, status = None, 'no checkpoint'
            elif not osp.isfile(entry['checkpoint']):
                metrics, status = None, f"checkpoint not found: {entry['checkpoint']}"
            elif args.dry_run:
                print(' '.join(build_test_command(entry, work_dir, args.gpus, args.cfg_options, args.unsafe_load,
                                                  args.allow_partial)))
                metrics, status = None, 'dry run'
            else:
                if not show:
                    print(f"[{i}/{len(entries)}] {entry['name']}: evaluating {entry['checkpoint']}",
                          file=sys.stderr, flush=True)
                metrics, status = run_test(entry, work_dir, args.gpus, args.cfg_options, args.unsafe_load,
                                           args.allow_partial)
                bar.update()
            rows += table_rows(entry, metrics, status)

    table = format_table(rows)
    print(table)
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            if args.out.endswith('.json'):
                json.dump(rows, f, indent=2)
            else:
                f.write(table + '\n')
    return rows


if __name__ == '__main__':
    # a refused checkpoint (unsafe, or not fitting its config) fails the whole check
    if any(str(row.get('status', '')).startswith('refused') for row in run_cli(main)):
        sys.exit(1)
