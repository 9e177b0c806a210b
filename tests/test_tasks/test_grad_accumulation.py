"""``tools/train.py --accumulate N``: the images per step, schedule and EMA of a recipe on fewer GPUs;
``tools/model_converters/extract_weights.py`` on the EMA checkpoint it writes."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import REPO_ROOT, call_tool, load_tool, run_tool
from polaformerpp.engine import accumulated, apply_accumulation
from recipe_testing import lr_at
from test_classification_e2e import read_scalars


def published(pattern):
    paths = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', pattern)))
    assert paths, pattern
    return Config.fromfile(paths[0])


def test_iteration_based_recipe_is_stretched():
    cfg = published('segmentation/polapp-b1_lightham_8xb*-160k_ade20k-512x512.py')
    acc = accumulated(cfg, 4)
    assert acc.optim_wrapper.accumulative_counts == 4
    assert acc.train_cfg.max_iters == 4 * cfg.train_cfg.max_iters
    assert acc.train_cfg.val_interval == 4 * cfg.train_cfg.val_interval
    for before, after in zip(cfg.param_scheduler, acc.param_scheduler):
        assert (after.begin, after.end) == (4 * before.begin, 4 * before.end)
    # step s is made on iteration 4s + 3: its lr is the published one within a step (s - 1 .. s + 1)
    steps = [1, 700, 1498, 1499, 1500, 2600, 80000]
    made = lr_at(acc, [4 * s + 3 for s in steps])
    near = [lr_at(cfg, [s - 1, s, s + 1]) for s in steps]
    for s, lr, values in zip(steps, made, near):
        assert min(values) * (1 - 1e-9) <= lr <= max(values) * (1 + 1e-9), (s, lr, values)
    assert cfg.optim_wrapper.get('accumulative_counts', 1) == 1  # accumulated() copies


def test_epoch_based_recipe_keeps_epochs_and_ema_steps_once_per_update():
    cfg = published('classification/polapp-b2_8xb*_in1k.py')
    acc = accumulated(cfg, 2)
    assert acc.train_cfg.max_epochs == cfg.train_cfg.max_epochs
    ema, = [h for h in acc.custom_hooks if h.type == 'EMAHook']
    assert (ema.interval, ema.begin_iter) == (2, 2)  # starts on iteration 1, updates on 1, 3, 5, ...
    # schedulers counted in epochs are converted with the loader's (twice as long) epochs: unchanged,
    # but WarmupCosineLR learns that an update spans 2 iterations (its values then fall on the updates)
    for before, after in zip(cfg.param_scheduler, acc.param_scheduler):
        assert before.get('by_epoch', True) and before.type == 'WarmupCosineLR'
        assert after == dict(before, accumulative_counts=2)


@pytest.mark.parametrize('n', [0, -2, 1.5, True])
def test_bad_accumulation_is_refused(n):
    cfg = published('classification/polapp-b0_8xb*_in1k.py')
    with pytest.raises(ValueError, match='--accumulate: expected a positive integer'):
        apply_accumulation(cfg, n)


def test_unknown_iteration_scheduler_is_refused():
    cfg = published('classification/polapp-b0_8xb*_in1k.py')
    cfg.param_scheduler = [dict(type='MyWarmup', by_epoch=False, begin=0, end=10)]
    with pytest.raises(ValueError, match="'MyWarmup' is iteration-based"):
        apply_accumulation(cfg, 2)


def final_weights(work_dir):
    checkpoint = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu', weights_only=False)
    return checkpoint['state_dict'], checkpoint['ema_state_dict']


@pytest.mark.slow
def test_accumulated_run_equals_the_large_batch_run(demo_in1k, tmp_path):
    """8 images per step as 1 x 8 and as 1 x 4 x 2 (``--accumulate 2``), both with ``--auto-scale-lr``:
    the same weights and EMA weights after 3 steps. BatchNorm is frozen, the lr constant and the
    optimizer SGD (Adam's first steps magnify rounding), so nothing but the grouping of the images
    differs; mmengine's own lr scaling would halve the lr of the second run, and an EMA updated on
    every iteration, or off the step boundaries, would average other weights."""
    config = tmp_path / 'accumulation_demo.py'
    config.write_text(
        f"_base_ = [{osp.join(REPO_ROOT, 'configs/classification/polapp-b0_1xb32-30e_demo-shapes.py')!r}]\n"
        "model = dict(backbone=dict(norm_eval=True))\n"
        "param_scheduler = None\n"
        "custom_hooks = [dict(type='EMAHook', momentum=0.1, priority='ABOVE_NORMAL')]\n"
        "auto_scale_lr = dict(base_batch_size=8)\n"
        "optim_wrapper = dict(optimizer=dict(_delete_=True, type='SGD', lr=1e-3, momentum=0.9, weight_decay=0.05))\n")
    options = []
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{key}.dataset.data_root={demo_in1k}', f'{key}.num_workers=0']
    options += ['train_dataloader.dataset.pipeline.1.scale=32', 'train_dataloader.dataset.indices=24',
                'train_cfg.max_epochs=1', 'train_cfg.val_interval=2']
    runs = {}
    for name, batch, extra in (('large', 8, []), ('accumulated', 4, ['--accumulate', '2'])):
        work_dir = str(tmp_path / name)
        call_tool(['tools/train.py', str(config), '--work-dir', work_dir, '--auto-scale-lr', *extra,
                   '--cfg-options', *options, f'train_dataloader.batch_size={batch}'])
        runs[name] = final_weights(work_dir)
        lrs = [r['lr'] for r in read_scalars(work_dir) if 'lr' in r]
        assert lrs and lrs == pytest.approx([1e-3] * len(lrs)), (name, lrs)  # 8 images per step: no rescaling
    for (large, acc) in zip(runs['large'], runs['accumulated']):
        for key, value in large.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                torch.testing.assert_close(acc[key], value, rtol=1e-4, atol=2e-6, msg=key)
    # (EMAHook swaps them: the file's state_dict holds the EMA weights, ema_state_dict the raw ones)
    assert int(runs['accumulated'][1]['steps']) == 5  # averaged-model calls from iteration 1 on (6 - 1)

    # the raw weights of that checkpoint, written out and loaded as a dense backbone's init_cfg
    checkpoint = osp.join(str(tmp_path / 'accumulated'), 'epoch_1.pth')
    raw_file, ema_file = str(tmp_path / 'raw.pth'), str(tmp_path / 'ema.pth')
    run_tool(['tools/model_converters/extract_weights.py', checkpoint, raw_file, '--weights', 'raw'])
    # the same command line once more, in this process (the process itself was checked just above)
    assert load_tool('tools/model_converters/extract_weights.py').main([checkpoint, ema_file, '--weights', 'ema']) == 0
    ema, raw = runs['accumulated']
    written = torch.load(raw_file, weights_only=True)['state_dict']
    assert set(written) == set(ema) and all(torch.equal(written[k], raw['module.' + k]) for k in written)
    written = torch.load(ema_file, weights_only=True)['state_dict']
    assert all(torch.equal(written[k], ema[k]) for k in ema)
    from polaformerpp.models.backbones import PolaFormerPP
    backbone = PolaFormerPP(arch='b0', out_indices=(0, 1, 2, 3),
                            init_cfg=dict(type='Pretrained', checkpoint=raw_file, prefix='backbone.'))
    backbone.init_weights()
    stem = 'backbone.stem.0.conv.weight'
    assert not torch.equal(ema[stem], raw['module.' + stem])
    assert torch.equal(backbone.state_dict()['stem.0.conv.weight'], raw['module.' + stem])


def toy_model():
    """One weight and a loss on it, as an mmengine model."""
    from mmengine.model import BaseModel

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))

        def forward(self, inputs, data_samples=None, mode='loss'):
            return dict(loss=((self.weight * inputs) ** 2).mean())

    return Toy()


@pytest.mark.parametrize('n', [1, 2])
def test_runner_steps_with_the_authors_lr(tmp_path, n):
    """mmengine's Runner trains b4's published schedule (310 epochs, 1 optimizer step each) with
    ``--accumulate n``: the lr each optimizer step is made with is timm's, as the authors' loop
    uses it (their formula: test_classification_configs.authors_lrs)."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    from test_classification_configs import AUTHORS, authors_lrs
    cfg = accumulated(published('classification/polapp-b4_8xb128_in1k.py'), n)
    used = []

    class RecordStepLR(Hook):
        def before_train(self, runner):
            optimizer = runner.optim_wrapper.optimizer
            optimizer.register_step_pre_hook(lambda opt, *_: used.append(opt.param_groups[0]['lr']))

    runner = Runner(
        model=toy_model(), work_dir=str(tmp_path), default_scope='mmengine',
        train_dataloader=dict(dataset=[dict(inputs=torch.ones(1))] * n, batch_size=1, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=True, max_epochs=cfg.train_cfg.max_epochs),
        optim_wrapper=dict(cfg.optim_wrapper, paramwise_cfg=None), param_scheduler=cfg.param_scheduler,
        default_hooks=dict(checkpoint=None, logger=None), custom_hooks=[RecordStepLR()],
        log_level='WARNING', env_cfg=dict(dist_cfg=dict(backend='gloo')))
    runner.train()
    expected = authors_lrs(AUTHORS['b4'], steps_per_epoch=1)
    assert len(used) == len(expected) == 310
    assert used == pytest.approx(expected, rel=1e-9, abs=0)
