"""Writes torch.save files with real PyTorch, plus what PyTorch itself sees in them.

Usage: make_torch_fixtures.py OUT_DIR GROUP...
Groups: basic (state dicts, views, dtypes, legacy, quantized, devices, refusals),
        models (whole pickled models, bundles, DataParallel, DDP, tied weights).

OUT_DIR/expected.tsv has one tab-separated line per fact, which the C++ tests compare against:
  tensor  FILE PATH DTYPE SHAPE STRIDE OFFSET REQUIRES_GRAD DEVICE STORAGE HEX
      a tensor at PATH in the loaded object (dict keys and list indices joined by '/'),
      STORAGE identifies its storage (equal for tensors sharing one), HEX its elements'
      bytes in row-major order. For quantized tensors DTYPE is e.g. qint8 and HEX is int_repr().
  state   FILE KEY ...same columns...
      an entry of the model's state_dict(), for files holding whole models or bundles.
  qparams FILE PATH SCHEME SCALE ZERO_POINT AXIS
  pyload  FILE ok|error:MESSAGE    whether torch.load(FILE) works in this Python.
"""
import collections
import importlib
import os
import shutil
import sys
import tarfile
import zipfile

import numpy as np
import torch
import torch.nn as nn

OUT = None
LINES = []


def path_of(prefix, part):
    return f'{prefix}/{part}' if prefix else str(part)


def tensor_columns(t, device):
    t_data = t.detach()
    if t_data.is_quantized:
        data = t_data.int_repr()
    else:
        data = t_data
    raw = data.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b''
    dtype = str(t.dtype).replace('torch.', '')
    shape = ','.join(str(s) for s in t.shape)
    stride = ','.join(str(s) for s in t.stride())
    storage = t_data.storage().data_ptr() if t_data.numel() else 0
    return [dtype, shape, stride, str(t.storage_offset()), str(int(t.requires_grad)), device,
            str(storage), raw.hex()]


def emit_tensors(file, obj, device='cpu', prefix=''):
    """Every tensor in obj (dicts, lists, tuples), as torch.load gives them."""
    if isinstance(obj, torch.Tensor):
        LINES.append(['tensor', file, prefix] + tensor_columns(obj, device))
        if obj.is_quantized:
            if obj.qscheme() == torch.per_tensor_affine:
                LINES.append(['qparams', file, prefix, 'per_tensor', repr(obj.q_scale()),
                              str(obj.q_zero_point()), '-1'])
            else:
                emit_tensors(file, obj.q_per_channel_scales(), device, prefix + '#scales')
                emit_tensors(file, obj.q_per_channel_zero_points(), device, prefix + '#zero_points')
                LINES.append(['qparams', file, prefix, 'per_channel', '0', '0',
                              str(obj.q_per_channel_axis())])
    elif isinstance(obj, dict):
        for key, value in obj.items():
            emit_tensors(file, value, device, path_of(prefix, key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            emit_tensors(file, value, device, path_of(prefix, i))


def emit_state(file, state_dict, device='cpu'):
    for key, value in state_dict.items():
        LINES.append(['state', file, key] + tensor_columns(value, device))


def emit_pyload(file):
    try:
        torch.load(os.path.join(OUT, file))
        LINES.append(['pyload', file, 'ok'])
    except Exception as e:  # pylint: disable=broad-except
        message = ' '.join(f'{type(e).__name__}: {e}'.split())
        LINES.append(['pyload', file, 'error:' + message[:300]])


def save(obj, file, **kwargs):
    torch.save(obj, os.path.join(OUT, file), **kwargs)


class FixtureTensor(torch.Tensor):
    """A tensor subclass whose class does not exist where the file is read."""


class ScriptedNet(nn.Module):
    """Parameters, buffers (one non-persistent), a plain tensor attribute and nested modules."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer('mask', torch.ones(3), persistent=False)
        self.plain = torch.zeros(2)  # an attribute, not a buffer: not in state_dict()
        self.features = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.BatchNorm2d(2),
                                      nn.ReLU())
        self.head = nn.Linear(2, 3)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3))) * self.scale * self.mask


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


# --- basic ---------------------------------------------------------------------------------------

def views():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        'base': base,
        'transposed': base.t(),
        'sliced': base[1:, 2:],
        'strided': base[::2, ::3],
        'narrow': torch.arange(10, dtype=torch.int64)[3:7],
        'expanded': torch.tensor([[1.0], [2.0], [3.0]]).expand(3, 4),
        'scalar': torch.tensor(3.5),
        'empty': torch.empty(0, 3),
    }


def dtypes():
    values = [1.5, -2.25, 0.0, 1000.0]
    out = {}
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        out[str(dtype).replace('torch.', '')] = torch.tensor(values, dtype=dtype)
    for dtype in [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]:
        out[str(dtype).replace('torch.', '')] = torch.tensor([1, 2, 100, 7], dtype=dtype)
    out['int64_big'] = torch.tensor([2**62, -2**62, -1], dtype=torch.int64)
    out['bool'] = torch.tensor([True, False, True])
    out['complex64'] = torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64)
    out['complex128'] = torch.tensor([1 + 2j, -3.5j], dtype=torch.complex128)
    return out


def make_basic():
    torch.manual_seed(0)
    model = mlp()
    sd = model.state_dict()
    save(sd, 'plain.pt')
    emit_tensors('plain.pt', sd)

    save(nn.DataParallel(model).state_dict(), 'dataparallel.pt')
    emit_tensors('dataparallel.pt', nn.DataParallel(model).state_dict())

    # Saved "on cuda:1": every storage's location tag says so.
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: 'cuda:1'
    try:
        save(sd, 'cuda1.pt')
    finally:
        torch.serialization.location_tag = original
    emit_tensors('cuda1.pt', sd, device='cuda:1')
    emit_pyload('cuda1.pt')

    v = views()
    save(v, 'views.pt')
    emit_tensors('views.pt', v)
    save(v['sliced'], 'root_tensor.pt')
    emit_tensors('root_tensor.pt', v['sliced'])

    d = dtypes()
    save(d, 'dtypes.pt')
    emit_tensors('dtypes.pt', d)
    save(d, 'dtypes_p4.pt', pickle_protocol=4)
    emit_tensors('dtypes_p4.pt', d)

    legacy = {'views': v, 'dtypes': d, 'model': sd,
              'param': nn.Parameter(torch.tensor([1.0, 2.0]))}
    save(legacy, 'legacy.pt', _use_new_zipfile_serialization=False)
    emit_tensors('legacy.pt', legacy)

    write_big_endian_legacy('legacy.pt', 'legacy_bigendian.pt')
    emit_tensors('legacy_bigendian.pt', legacy)

    # Tensors as pre-1.0 PyTorch pickled them: an empty tensor of the typed class
    # (torch.FloatTensor, torch.LongTensor) plus a __setstate__ tuple (storage, offset, size,
    # stride), which Tensor.__setstate__ still reads; a view among them.
    base = torch.arange(12.0).reshape(3, 4)
    setstate = {'w': base, 'row': base[1], 'ints': torch.tensor([7, -1], dtype=torch.int64)}
    reduce_ex = torch.Tensor.__reduce_ex__
    torch.Tensor.__reduce_ex__ = lambda self, proto: (
        getattr(torch, self.type().split('.')[-1]), (),
        (self.storage(), self.storage_offset(), tuple(self.size()), self.stride()))
    try:
        save(setstate, 'legacy_setstate.pt', _use_new_zipfile_serialization=False)
    finally:
        torch.Tensor.__reduce_ex__ = reduce_ex
    loaded = torch.load(os.path.join(OUT, 'legacy_setstate.pt'))
    assert torch.equal(loaded['row'], base[1]), loaded
    emit_tensors('legacy_setstate.pt', setstate)

    q = {
        'per_tensor': torch.quantize_per_tensor(torch.tensor([[-1.0, 0.5], [0.25, 2.0]]),
                                                0.1, 3, torch.qint8),
        'per_channel': torch.quantize_per_channel(
            torch.tensor([[-1.0, 0.5, 3.0], [0.25, 2.0, -0.5]]),
            torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0, 2]), 0, torch.quint8),
    }
    save(q, 'quantized.pt')
    emit_tensors('quantized.pt', q)

    params = {'weight': nn.Parameter(torch.tensor([[1.0, 2.0]])),
              'frozen': nn.Parameter(torch.tensor([3.0]), requires_grad=False)}
    save(params, 'parameters.pt')
    emit_tensors('parameters.pt', params)

    tagged = nn.Parameter(torch.tensor([5.0, 6.0]))
    tagged.tag = 'tagged'
    misc = {
        'device': torch.device('cuda', 1),
        'dtype': torch.bfloat16,
        'size': torch.Size([2, 3]),
        'np_f32': np.float32(1.5),
        'np_f16': np.float16(-2.5),
        'np_u8': np.uint8(200),
        'np_bool': np.bool_(True),
        'np_array': np.arange(3),
        'slice': slice(1, 5, 2),
        'set': {1},
        'bytes': b'\x00\xff',
        'subclass': torch.arange(4, dtype=torch.float32).as_subclass(FixtureTensor),
        'tagged_param': tagged,
    }
    save(misc, 'misc.pt')
    emit_tensors('misc.pt', {'subclass': misc['subclass'], 'tagged_param': tagged})

    # TorchScript archives: what torch.jit.load(...).state_dict() gives (non-persistent buffers
    # included, as TorchScript does not record persistence), and with state_dict_keys.txt what
    # the Python module's state_dict() gives; scripted and traced.
    def jit_save(module, file, **kwargs):
        module.save(os.path.join(OUT, file), **kwargs)
        emit_tensors(file, torch.jit.load(os.path.join(OUT, file)).state_dict())

    jit_save(torch.jit.script(model), 'torchscript.pt')
    net = ScriptedNet()
    jit_save(torch.jit.script(net), 'torchscript_nokeys.pt')
    jit_save(torch.jit.trace(net, torch.zeros(1, 1, 5, 5)), 'torchscript_traced.pt')
    net.eval()
    torch.jit.script(net).save(os.path.join(OUT, 'torchscript_keys.pt'), _extra_files={
        'state_dict_keys.txt': '\n'.join(net.state_dict().keys())})
    emit_tensors('torchscript_keys.pt', net.state_dict())

    # A big-endian copy of plain.pt: same pickle, byteswapped float32 records, byteorder "big".
    with zipfile.ZipFile(os.path.join(OUT, 'plain.pt')) as src, \
            zipfile.ZipFile(os.path.join(OUT, 'bigendian.pt'), 'w', zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if '/data/' in info.filename:
                data = np.frombuffer(data, dtype='<f4').astype('>f4').tobytes()
            dst.writestr(info.filename.replace('plain/', 'bigendian/'), data)
        dst.writestr('bigendian/byteorder', b'big')
    emit_tensors('bigendian.pt', sd)

    with tarfile.open(os.path.join(OUT, 'old_tar.pt'), 'w') as tar:
        for name in ('sys_info', 'pickle', 'storages', 'tensors'):
            path = os.path.join(OUT, name)
            with open(path, 'wb') as f:
                f.write(b'\x80\x02N.')
            tar.add(path, arcname=name)
            os.remove(path)

    import pickle
    with open(os.path.join(OUT, 'plain_pickle.pkl'), 'wb') as f:
        pickle.dump({'not': 'a checkpoint'}, f, protocol=2)


def write_big_endian_legacy(src, dst):
    """Rewrites a legacy file as the legacy writer writes one on a big-endian host: its sys_info
    says little_endian False, but THPStorage_writeFileRaw stores every count and element
    little-endian whatever the host, so the data section stays byte for byte the same. torch
    loads it as is (checked here), and so must ckpt."""
    import io
    import pickle
    with open(os.path.join(OUT, src), 'rb') as f:
        data = f.read()
    f = io.BytesIO(data)
    pickle.load(f)  # Magic number.
    pickle.load(f)  # Protocol version.
    sys_info_start = f.tell()
    sys_info = pickle.load(f)
    main_start = f.tell()
    sys_info['little_endian'] = False
    out = data[:sys_info_start] + pickle.dumps(sys_info, protocol=2) + data[main_start:]
    with open(os.path.join(OUT, dst), 'wb') as f:
        f.write(out)
    original, rewritten = torch.load(os.path.join(OUT, src)), torch.load(os.path.join(OUT, dst))
    assert torch.equal(original['param'], rewritten['param'])


# --- models --------------------------------------------------------------------------------------

MODEL_SOURCE = '''
import torch
import torch.nn as nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 2)
        self.register_buffer('steps', torch.tensor(5, dtype=torch.int64))
        self.note = 'not a tensor'


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU())
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # Tied.
        self.register_buffer('scale', torch.tensor([2.0]))
        self.register_buffer('cache', torch.zeros(3), persistent=False)
        self.register_buffer('maybe', None)
        self.register_parameter('unused', None)
        self.inner = Inner()
        self.missing = None

    def forward(self, ids):
        return self.head(self.block(self.embed(ids))) * self.scale
'''


def trained_net(module):
    torch.manual_seed(1)
    net = module.Net()
    net.train()
    net(torch.tensor([1, 2, 3, 4]))  # BatchNorm running stats and num_batches_tracked move.
    return net


def ddp_worker(rank, store_path, out_path):
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method='file://' + store_path, rank=rank, world_size=2)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(mlp())
    loss = ddp(torch.ones(2, 4)).sum()
    loss.backward()
    if rank == 0:
        torch.save(ddp.state_dict(), out_path)
    dist.barrier()
    dist.destroy_process_group()


def make_models():
    src_dir = os.path.join(OUT, 'modsrc')
    os.makedirs(src_dir, exist_ok=True)
    with open(os.path.join(src_dir, 'ckpt_fixture_models.py'), 'w') as f:
        f.write(MODEL_SOURCE)
    sys.path.insert(0, src_dir)
    module = importlib.import_module('ckpt_fixture_models')
    net = trained_net(module)
    save(net, 'whole_model.pt')
    save(net, 'legacy_whole_model.pt', _use_new_zipfile_serialization=False)
    emit_state('whole_model.pt', net.state_dict())
    emit_state('legacy_whole_model.pt', net.state_dict())

    wrapped = nn.DataParallel(net)
    save({'model': wrapped, 'epoch': 3}, 'whole_dataparallel.pt')
    emit_state('whole_dataparallel.pt', wrapped.state_dict())

    sd = net.state_dict()
    save(sd, 'tied_bn.pt')
    emit_tensors('tied_bn.pt', sd)

    # The class's package disappears: Python can no longer load the whole model.
    sys.path.remove(src_dir)
    del sys.modules['ckpt_fixture_models']
    shutil.rmtree(src_dir)
    emit_pyload('whole_model.pt')

    torch.manual_seed(2)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
    bundle = {
        'epoch': 7,
        'global_step': 1234,
        'model': model.state_dict(),
        'optimizer': optimizer.state_dict(),
        'scheduler': scheduler.state_dict(),
        'best_acc': np.float64(0.875),
        'np_count': np.int64(42),
        'config': {'lr': 1e-3, 'name': 'run1', 'layers': [4, 8, 3], 'betas': (0.9, 0.999)},
        'rng': torch.get_rng_state(),
    }
    save(bundle, 'bundle.pt')
    emit_tensors('bundle.pt', {k: v for k, v in bundle.items()})
    emit_state('bundle.pt', model.state_dict())
    save(bundle, 'bundle_p4.pt', pickle_protocol=4)
    emit_state('bundle_p4.pt', model.state_dict())

    nested = {'checkpoint': {'state_dict': model.state_dict(), 'step': 99}, 'optim': optimizer.state_dict()}
    save(nested, 'nested_bundle.pt')
    emit_state('nested_bundle.pt', model.state_dict())

    import torch.multiprocessing as mp
    os.environ.setdefault('GLOO_SOCKET_IFNAME', 'lo')
    store = os.path.join(OUT, 'ddp_store')
    if os.path.exists(store):
        os.remove(store)
    mp.spawn(ddp_worker, args=(store, os.path.join(OUT, 'ddp.pt')), nprocs=2)
    ddp_sd = torch.load(os.path.join(OUT, 'ddp.pt'))
    emit_tensors('ddp.pt', ddp_sd)
    emit_state('ddp.pt', ddp_sd)


def main():
    global OUT
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    groups = sys.argv[2:]
    if 'basic' in groups:
        make_basic()
    if 'models' in groups:
        make_models()
    with open(os.path.join(OUT, 'expected.tsv'), 'w') as f:
        for line in LINES:
            f.write('\t'.join(line) + '\n')


if __name__ == '__main__':
    main()
