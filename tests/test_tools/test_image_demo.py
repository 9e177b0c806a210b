"""demo/image_demo.py: one config per task on a real photograph (scikit-image's astronaut,
downscaled), through its command line (``main(argv)``, ``-m slow``), and the argument errors (fast)."""
import json
import os.path as osp

import cv2
import numpy as np
import pytest

from conftest import REPO_ROOT, call_tool, load_tool

CLS_B0 = 'configs/classification/polapp-b0_8xb256_in1k.py'
MASK_RCNN_B2 = 'configs/detection/mask-rcnn_polapp-b2_fpn_8xb2-amp-1x_coco.py'
LIGHTHAM_B1 = 'configs/segmentation/polapp-b1_lightham_8xb8-160k_ade20k-512x512.py'
UPERNET_B2 = 'configs/segmentation/upernet_polapp-b2_8xb2-160k_ade20k-512x512.py'
SR_X2 = 'configs/super_resolution/polapp-srlight_x2_8xb16-500k_div2k-192.py'
DIT_S = 'configs/generation/dit-s-2_polapp_8xb32-100e_in1k-256.py'


@pytest.fixture(scope='module')
def demo():
    return load_tool('demo/image_demo.py')


def astronaut(path, size):
    """scikit-image's astronaut photograph as a ``size`` x ``size`` BGR PNG at ``path``."""
    from skimage import data
    img = cv2.resize(data.astronaut()[:, :, ::-1], (size, size), interpolation=cv2.INTER_AREA)
    assert cv2.imwrite(str(path), img)
    return str(path)


@pytest.fixture(scope='module')
def photo(tmp_path_factory):
    return astronaut(tmp_path_factory.mktemp('photo') / 'astronaut.png', 128)


def run_demo(*args):
    """The demo's command line (its ``main``) in this process on one thread; what it printed.

    The process itself is not what these tests check (the refusals above run in-process
    too): starting one would add its imports, several seconds, to each.
    """
    return call_tool(['demo/image_demo.py', *args], env=dict(OMP_NUM_THREADS='1')).stdout


def read(path):
    assert osp.isfile(path), path
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert img is not None, f'not readable: {path}'
    return img


def written(stdout):
    """The paths the demo reports after 'written:'."""
    lines = stdout.split('written:', 1)[1].splitlines()
    return [line.strip() for line in lines if line.startswith('  ')]


# ------------------------------------------------------------------------- argument errors


def expect_usage_error(demo, capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exc:
        demo.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err


def test_missing_image(demo, capsys, tmp_path):
    missing = str(tmp_path / 'nope.jpg')
    expect_usage_error(demo, capsys, [missing, osp.join(REPO_ROOT, CLS_B0)], 'argument image', missing)


def test_missing_config(demo, capsys, photo, tmp_path):
    missing = str(tmp_path / 'nope.py')
    expect_usage_error(demo, capsys, [photo, missing], 'argument config', missing)


def test_missing_weights(demo, capsys, photo, tmp_path):
    missing = str(tmp_path / 'epoch_12.pth')
    expect_usage_error(demo, capsys, [photo, osp.join(REPO_ROOT, CLS_B0), '--weights', missing],
                       'argument --weights', 'checkpoint not found', missing)


def test_undecodable_image(demo, capsys, tmp_path):
    fake = tmp_path / 'fake.png'
    fake.write_text('not a PNG')
    expect_usage_error(demo, capsys, [str(fake), osp.join(REPO_ROOT, CLS_B0), '--device', 'cpu'],
                       'argument image', 'not an image')


def test_config_of_another_task(demo, capsys, photo, tmp_path):
    expect_usage_error(demo, capsys, [photo, osp.join(REPO_ROOT, DIT_S), '--device', 'cpu',
                                      '--out-dir', str(tmp_path / 'out')],
                       'argument config', "default_scope='mmengine'", 'SRRestorer', 'tools/generation/sample.py')
    assert not (tmp_path / 'out').exists()


def test_bad_numbers(demo, capsys, photo):
    cfg = osp.join(REPO_ROOT, CLS_B0)
    expect_usage_error(demo, capsys, [photo, cfg, '--topk', '0'], 'argument --topk')
    expect_usage_error(demo, capsys, [photo, cfg, '--opacity', '1.5'], 'argument --opacity')


@pytest.mark.parametrize('config, task', [(CLS_B0, 'classification'), (MASK_RCNN_B2, 'detection'),
                                          (LIGHTHAM_B1, 'segmentation'), (UPERNET_B2, 'segmentation'),
                                          (SR_X2, 'super_resolution')])
def test_task_follows_from_the_config(demo, config, task):
    from mmengine.config import Config
    assert demo.task_of(Config.fromfile(osp.join(REPO_ROOT, config)), config) == task


def test_side_by_side(demo):
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (40, 30, 3), dtype=np.uint8) for _ in range(2))
    pair = demo.side_by_side(a, b)
    assert pair.shape == (40, 60, 3) and pair.dtype == np.uint8
    assert np.array_equal(pair[-10:, :30], a[-10:]) and np.array_equal(pair[-10:, 30:], b[-10:])
    with pytest.raises(ValueError, match='one shape'):
        demo.side_by_side(a, b[:20])


# ------------------------------------------------------------------------- one config per task


@pytest.mark.slow
def test_classification_b0_with_checkpoint(demo, photo, tmp_path):
    # a checkpoint holding only the head that makes class 7 win, with its own class names in
    # meta.dataset_meta: refused as not fitting the model, run with --allow-partial (the rest keeps
    # its initialisation)
    import torch

    from polaformerpp.utils import CheckpointMismatchError
    classes = [f'class_{i}' for i in range(1000)]
    bias = torch.zeros(1000)
    bias[7], bias[3] = 20.0, 19.0
    ckpt = str(tmp_path / 'head_only.pth')
    torch.save(dict(meta=dict(dataset_meta=dict(classes=classes)),
                    state_dict={'head.fc.weight': torch.zeros(1000, 2048), 'head.fc.bias': bias}), ckpt)
    out = str(tmp_path / 'out')
    with pytest.raises(CheckpointMismatchError, match=r'missing in the checkpoint \(224\)'):
        demo.main([photo, CLS_B0, '--weights', ckpt, '--out-dir', out, '--device', 'cpu'])
    stdout = run_demo(photo, CLS_B0, '--weights', ckpt, '--allow-partial', '--out-dir', out,
                      '--topk', '3', '--device', 'cpu')
    vis, pred = osp.join(out, 'vis', 'astronaut.png'), osp.join(out, 'preds', 'astronaut.json')
    assert written(stdout) == [vis, pred]
    assert read(vis).ndim == 3
    with open(pred) as f:
        topk = json.load(f)['topk']
    assert [item['label'] for item in topk[:2]] == [7, 3]
    assert [item['class'] for item in topk[:2]] == ['class_7', 'class_3']
    scores = [item['score'] for item in topk]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0.5
    assert 'top-1: 7 class_7' in stdout and 'top-2: 3 class_3' in stdout


@pytest.mark.slow
def test_detection_mask_rcnn_b2(photo, tmp_path):
    # the real arch on a small test scale; the random model's scores are all below mmdet's
    # 0.05, so the threshold is lowered to have instances to draw
    out = str(tmp_path / 'out')
    stdout = run_demo(photo, MASK_RCNN_B2, '--out-dir', out, '--score-thr', '0', '--device', 'cpu',
                      '--cfg-options', 'test_dataloader.dataset.pipeline.1.scale=(256,160)',
                      'model.test_cfg.rcnn.score_thr=0.0', 'model.test_cfg.rcnn.max_per_img=5')
    vis, pred = osp.join(out, 'vis', 'astronaut.png'), osp.join(out, 'preds', 'astronaut.json')
    assert sorted(written(stdout)) == sorted([vis, pred])
    drawn = read(vis)
    assert drawn.shape == (128, 128, 3)
    assert not np.array_equal(drawn, read(photo)), 'nothing drawn'
    with open(pred) as f:
        result = json.load(f)
    assert len(result['scores']) == 5 and len(result['bboxes']) == 5 and len(result['masks']) == 5
    assert all(m['size'] == [128, 128] for m in result['masks'])  # RLE at the input size
    assert '5 instances predicted' in stdout


@pytest.mark.slow
def test_segmentation_lightham_b1(photo, tmp_path):
    out = str(tmp_path / 'out')
    stdout = run_demo(photo, LIGHTHAM_B1, '--out-dir', out, '--device', 'cpu',
                      '--cfg-options', 'test_dataloader.dataset.pipeline.1.scale=(128,128)')
    vis = osp.join(out, 'vis', 'astronaut.png')
    paths = written(stdout)
    assert vis in paths
    drawn = read(vis)
    assert drawn.shape == (128, 128, 3)
    assert not np.array_equal(drawn, read(photo)), 'nothing drawn'
    masks = [p for p in paths if p != vis]
    assert len(masks) == 1 and read(masks[0]).shape == (128, 128)
    assert read(masks[0]).max() < 150  # ADE20K's 150 classes
    assert 'most frequent classes' in stdout


@pytest.mark.slow
def test_super_resolution_x2(tmp_path):
    lr = astronaut(tmp_path / 'lr.png', 96)
    out = str(tmp_path / 'out')
    stdout = run_demo(lr, SR_X2, '--out-dir', out, '--device', 'cpu')
    sr_path, pair_path = osp.join(out, 'lr_x2.png'), osp.join(out, 'lr_x2_vs_bicubic.png')
    assert written(stdout) == [sr_path, pair_path]
    sr, pair = read(sr_path), read(pair_path)
    assert sr.shape == (192, 192, 3) and sr.dtype == np.uint8
    assert pair.shape == (192, 384, 3)
    assert np.array_equal(pair[-100:, 192:], sr[-100:])  # below the caption: the network's output
    bicubic = cv2.resize(read(lr), (192, 192), interpolation=cv2.INTER_CUBIC)
    assert np.array_equal(pair[-100:, :192], bicubic[-100:])
