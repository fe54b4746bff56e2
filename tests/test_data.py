import os

import numpy as np
import pytest
import torch

from helpers import data, locks


def test_standin_shapes_and_determinism():
    fm = data.StandInImages("fashionmnist", train=True, length=20)
    cf = data.StandInImages("cifar10", train=False, length=20)
    assert fm.array(3).shape == (28, 28) and cf.array(3).shape == (32, 32, 3)
    assert np.array_equal(fm.array(5), data.StandInImages("fashionmnist", length=20).array(5))
    assert not np.array_equal(fm.array(5), fm.array(6))
    assert len(fm.classes) == 10 and sorted(set(fm.targets)) == list(range(10))
    img, label = data.load_dataset("cifar10", train=True, source="standin", standin_length=4)[1]
    assert img.shape == (3, 32, 32) and img.dtype == torch.float32 and 0 <= label < 10
    with pytest.raises(IndexError):
        fm.array(20)
    assert "stand-in" in repr(fm)


def test_standin_classes_are_separable_on_average():
    ds = data.StandInImages("fashionmnist", length=200)
    means = np.stack([np.mean([ds.array(i) for i in range(200) if ds.targets[i] == c], axis=0) for c in range(10)])
    within = np.mean([np.abs(ds.array(i) - means[ds.targets[i]]).mean() for i in range(50)])
    between = np.mean([np.abs(ds.array(i) - means[(ds.targets[i] + 1) % 10]).mean() for i in range(50)])
    assert between > within


def test_default_source_follows_profile(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    ds = data.load_dataset("fashionmnist", train=False)
    assert data.is_standin(ds) and len(ds) == 10_000


def test_real_dataset_missing_offline_gives_clear_error(tmp_path, monkeypatch):
    class Offline:
        def __init__(self, root, train, transform, download):
            if download:
                raise OSError("network unreachable")
            raise RuntimeError("Dataset not found")

    monkeypatch.setattr(data, "_torchvision_class", lambda name: Offline)
    with pytest.raises(data.DatasetUnavailableError, match="COURSE_DATA=standin") as info:
        data.load_dataset("cifar10", source="real", root=tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(data.DatasetUnavailableError):
        data.load_dataset("cifar10", source="real", root=tmp_path, download=False)


def _write_idx(path, array):
    """One file in the idx format torchvision's MNIST family reads (big-endian header, uint8 data)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_real_fashionmnist_loads_through_torchvision_offline(tmp_path):
    from torchvision.datasets import FashionMNIST

    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    splits = {"train": 12, "t10k": 5}
    images = {s: rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8) for s, n in splits.items()}
    for split, n in splits.items():
        _write_idx(raw / f"{split}-images-idx3-ubyte", images[split])
        _write_idx(raw / f"{split}-labels-idx1-ubyte", (np.arange(n) * 3) % 10)
    train = data.load_dataset("fashionmnist", train=True, source="real", root=tmp_path, download=False)
    test = data.load_dataset("fashionmnist", train=False, source="real", root=tmp_path)
    assert isinstance(train, FashionMNIST) and (len(train), len(test)) == (12, 5)
    assert not data.is_standin(train) and not data.is_standin(data.take(train, 4))
    img, label = train[3]
    assert img.shape == (1, 28, 28) and label == 9
    assert torch.equal((img[0] * 255).round().to(torch.uint8), torch.from_numpy(images["train"][3]))
    assert [len(y) for _, y in data.make_loader(train, 5, train=True)] == [5, 5, 2]


def test_real_cifar10_is_checked_by_torchvision_and_refused_clearly(tmp_path):
    import pickle

    from torchvision.datasets import CIFAR10

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batch = {"data": np.zeros((4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list(data.SPECS["cifar10"].classes)}))
    with pytest.raises(RuntimeError, match="corrupted"):  # torchvision's own MD5 check rejects the files
        CIFAR10(root=str(tmp_path), train=True, download=False)
    with pytest.raises(data.DatasetUnavailableError, match="failed torchvision's check") as info:
        data.load_dataset("cifar10", source="real", root=tmp_path, download=False)
    assert str(folder) in str(info.value) and "COURSE_DATA=standin" in str(info.value)
    with pytest.raises(data.DatasetUnavailableError, match="is not in"):  # nothing there at all
        data.load_dataset("cifar10", source="real", root=tmp_path / "empty", download=False)


def test_real_dataset_found_on_disk(tmp_path, monkeypatch):
    class OnDisk(torch.utils.data.Dataset):
        def __init__(self, root, train, transform, download):
            self.root = root

    monkeypatch.setattr(data, "_torchvision_class", lambda name: OnDisk)
    ds = data.load_dataset("fashionmnist", source="real", root=tmp_path)
    assert ds.root == str(tmp_path) and not data.is_standin(ds)
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "x"))
    assert data.data_root() == tmp_path / "x"


def test_unknown_names():
    with pytest.raises(ValueError, match="fashionmnist, cifar10"):
        data.spec("mnist")
    with pytest.raises(ValueError):
        data.load_dataset("cifar10", source="web")


def test_take_is_seeded_subset():
    ds = data.StandInImages("fashionmnist", length=100)
    a, b = data.take(ds, 10, seed=1), data.take(ds, 10, seed=1)
    assert a.indices == b.indices and len(a) == 10 and data.is_standin(a)
    assert data.take(ds, None) is ds and data.take(ds, 1000) is ds
    with pytest.raises(ValueError):
        data.take(ds, 0)


def test_heavy_pipeline_output():
    ds = data.StandInImages("cifar10", length=2, transform=data.heavy_pipeline(size=64))
    img, _ = ds[0]
    assert img.shape == (3, 64, 64)
    assert len(data.heavy_pipeline().transforms) == 7


def test_epoch_sampler_orders():
    s = data.EpochShuffleSampler(10, seed=1)
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert sorted(first) == list(range(10)) and first != second
    s.set_epoch(0, start=4)
    assert list(s) == first[4:] and len(s) == 6
    assert list(data.EpochShuffleSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]
    assert s.order() == first  # the whole epoch's order, whatever the start
    g = torch.Generator().manual_seed(1 * 100_003 + 0)
    assert first == torch.randperm(10, generator=g).tolist()  # seeded by (seed, epoch) alone, not the global RNG


def test_make_loader_validates():
    from torchvision.transforms import ToTensor

    ds = data.StandInImages("fashionmnist", length=10, transform=ToTensor())
    loader = data.make_loader(ds, 4, train=True)
    assert [len(y) for _, y in loader] == [4, 4, 2]
    with pytest.raises(ValueError):
        data.make_loader(ds, 0, train=True)
    with pytest.raises(ValueError, match="num_workers > 0"):
        data.make_loader(ds, 4, train=True, persistent_workers=True)


@pytest.mark.parametrize("name", ["fashionmnist", "cifar10"])
def test_standin_tensors_equal_torchvision_to_tensor(name, monkeypatch):
    from torchvision.transforms import ToTensor

    monkeypatch.setenv("COURSE_DATA", "standin")
    fast = data.load_dataset(name, train=False, standin_length=3)        # no torchvision on this path
    slow = data.StandInImages(name, train=False, length=3, transform=ToTensor())
    for i in range(3):
        (a, ya), (b, yb) = fast[i], slow[i]
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape and ya == yb
        assert torch.equal(a, b)
    assert data.array_to_tensor(np.zeros((2, 3), np.uint8)).shape == (1, 2, 3)
    assert data.array_to_tensor(np.full((2, 3, 3), 255, np.uint8)).max() == 1.0


def test_download_lock_excludes_a_second_holder(tmp_path):
    import threading

    held, release = threading.Event(), threading.Event()
    order = []

    def first():
        with data.download_lock(tmp_path, "cifar-10-batches-py") as path:
            order.append("first in")
            held.set()
            release.wait(5)
            order.append("first out")
        assert path == tmp_path / ".cifar-10-batches-py.lock"

    t = threading.Thread(target=first)
    t.start()
    assert held.wait(5)
    with pytest.raises(locks.Held, match=rf"download lock .* is in use by process {os.getpid()} "):
        with data.download_lock(tmp_path, "cifar-10-batches-py", timeout=0.2):  # held by the thread: we must wait
            pass
    with data.download_lock(tmp_path, "FashionMNIST", timeout=0.2):  # another dataset: its own lock
        order.append("other dataset")
    release.set()
    with data.download_lock(tmp_path, "cifar-10-batches-py", timeout=5):
        order.append("second in")
    t.join()
    assert order == ["first in", "other dataset", "first out", "second in"]


def test_download_lock_serialises_processes(tmp_path):
    import multiprocessing as mp

    log = tmp_path / "log.txt"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_hold_lock_and_log, args=(tmp_path, log, f"p{i}")) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    assert [p.exitcode for p in procs] == [0, 0]
    lines = log.read_text().split()
    # each process writes "start" and "end" inside the lock: the two pairs never interleave
    assert sorted(lines) == sorted(["p0:start", "p0:end", "p1:start", "p1:end"])
    assert lines[0].split(":")[0] == lines[1].split(":")[0] and lines[2].split(":")[0] == lines[3].split(":")[0]


def _hold_lock_and_log(root, log, name):
    import time

    with data.download_lock(root, "cifar-10-batches-py", timeout=20):
        with open(log, "a") as f:
            f.write(f"{name}:start\n")
        time.sleep(0.3)
        with open(log, "a") as f:
            f.write(f"{name}:end\n")


def test_download_lock_fallbacks(tmp_path):
    target = tmp_path / "readonly"
    target.write_text("a file where the folder should be: the lock file cannot be created")
    with data.download_lock(target, "x") as path:  # cannot lock there: nothing is downloaded there either
        assert path is None
    with pytest.raises(ZeroDivisionError):  # an error inside the block is the caller's, and releases the lock
        with data.download_lock(tmp_path, "x"):
            1 / 0
    with data.download_lock(tmp_path, "x", timeout=0) as path:
        assert path == tmp_path / ".x.lock"


def test_real_dataset_is_checked_under_the_lock(tmp_path, monkeypatch):
    seen = []

    class Checks(torch.utils.data.Dataset):
        def __init__(self, root, train, transform, download):
            lock = tmp_path / ".cifar-10-batches-py.lock"
            seen.append(lock.exists())
            with pytest.raises(locks.Held):  # a second process would wait here
                with data.download_lock(tmp_path, "cifar-10-batches-py", timeout=0.1):
                    pass

    monkeypatch.setattr(data, "_torchvision_class", lambda name: Checks)
    data.load_dataset("cifar10", source="real", root=tmp_path)
    assert seen == [True]


def test_loading_pass_times_one_pass_of_a_new_loader():
    dataset = data.StandInImages("fashionmnist", length=10)
    one_round = data.loading_pass(dataset, 4)
    took, metrics = one_round()
    assert took > 0 and metrics["images_per_s"] == pytest.approx(10 / took)
    assert one_round()[1]["images_per_s"] > 0  # a round builds its loader anew
    with pytest.raises(ValueError):
        data.loading_pass(dataset, 4, num_workers=0, prefetch_factor=2)()
