"""FashionMNIST and CIFAR-10, real (downloaded under a lock) or the synthetic ``StandInImages``, and their loaders."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from . import locks, run_sizes


@dataclass(frozen=True)
class DatasetSpec:
    """Shape and class names of a dataset the course uses."""

    name: str
    channels: int
    size: int
    train_len: int
    test_len: int
    classes: tuple[str, ...]
    folder: str  # torchvision's folder of the real files
    standin_separation: float = 0.5  # how far apart the stand-in's class templates are


SPECS: dict[str, DatasetSpec] = {
    "fashionmnist": DatasetSpec("fashionmnist", 1, 28, 60_000, 10_000, (
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
        "FashionMNIST"),
    "cifar10": DatasetSpec("cifar10", 3, 32, 50_000, 10_000, (
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
        "cifar-10-batches-py", standin_separation=0.3),  # colour carries more signal: closer templates, as hard
}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class DatasetUnavailableError(RuntimeError):
    """The real dataset is neither on disk nor downloadable."""


def data_root() -> Path:
    """Where real datasets are stored: ``COURSE_DATA_DIR`` or ``~/.cache/accelerate-course/datasets``."""
    root = os.environ.get("COURSE_DATA_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "accelerate-course" / "datasets"


def spec(name: str) -> DatasetSpec:
    """The ``DatasetSpec`` for a dataset name (case-insensitive, '-' and '_' ignored)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in SPECS:
        raise ValueError(f"Unknown dataset {name!r}; choose one of {', '.join(SPECS)}.")
    return SPECS[key]


class StandInImages(Dataset):
    """Deterministic synthetic images like FashionMNIST or CIFAR-10: a class's template, shifted, scaled and noisy."""

    is_standin = True

    def __init__(self, name: str, train: bool = True, length: int | None = None, transform: Callable | None = None):
        self.spec, self.train, self.transform = spec(name), train, transform
        self.length = length if length is not None else (self.spec.train_len if train else self.spec.test_len)
        if self.length < 0:
            raise ValueError("length must be non-negative")
        self.classes = list(self.spec.classes)
        coarse = np.random.default_rng([0, 12345]).uniform(0.0, 1.0, size=(10, self.spec.channels, 7, 7))
        reps = int(np.ceil(self.spec.size / 7))
        full = np.kron(coarse, np.ones((1, 1, reps, reps)))[:, :, : self.spec.size, : self.spec.size]
        mean = full.mean(axis=0, keepdims=True)
        # Pull the class templates towards their mean: the smaller the separation, the harder.
        self._templates = (mean + self.spec.standin_separation * (full - mean)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    @property
    def targets(self) -> list[int]:
        return [self._label(i) for i in range(self.length)]

    def _label(self, index: int) -> int:
        return (index * 7 + (0 if self.train else 3)) % 10

    def array(self, index: int) -> np.ndarray:
        """Item ``index`` as a uint8 array of shape (H, W) or (H, W, 3)."""
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} items")
        rng = np.random.default_rng([0, 1 if self.train else 2, index])
        label = self._label(index)
        dy, dx = rng.integers(-2, 3, size=2)
        img = np.roll(self._templates[label], (int(dy), int(dx)), axis=(1, 2))
        img = img * rng.uniform(0.6, 1.0) + rng.normal(0.0, 0.45, size=img.shape)
        img = np.clip(img * 255.0, 0, 255).astype(np.uint8)
        return img[0] if self.spec.channels == 1 else np.transpose(img, (1, 2, 0))

    def __getitem__(self, index: int):
        if self.transform is None:  # a float tensor, as ToTensor makes it
            return array_to_tensor(self.array(index)), self._label(index)
        return self.transform(Image.fromarray(self.array(index))), self._label(index)

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"StandInImages({self.spec.name}, {split}, {self.length} items, synthetic stand-in)"


def array_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A uint8 (H, W) or (H, W, C) image as ``ToTensor`` makes it, without importing torchvision (1.5 s a process)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    tensor = tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1).contiguous()
    return tensor.to(dtype=torch.float32).div(255)


def _torchvision_class(name: str):
    from torchvision import datasets

    return {"fashionmnist": datasets.FashionMNIST, "cifar10": datasets.CIFAR10}[spec(name).name]


def load_dataset(name: str, train: bool = True, transform: Callable | None = None,
                 source: str | None = None, root: Path | str | None = None,
                 download: bool = True, standin_length: int | None = None) -> Dataset:
    """A split of ``name`` from ``source`` (default ``COURSE_DATA``); real files in ``root``, downloaded if missing."""
    source = source or run_sizes.data_source()
    if source == "standin":
        return StandInImages(name, train=train, length=standin_length, transform=transform)
    if source != "real":
        raise ValueError(f"Unknown data source {source!r}; use 'real' or 'standin'.")
    from torchvision import transforms

    transform = transform if transform is not None else transforms.ToTensor()
    cls = _torchvision_class(name)
    root = Path(root) if root is not None else data_root()
    with download_lock(root, spec(name).folder):
        try:
            ds = cls(root=str(root), train=train, transform=transform, download=False)
        except RuntimeError:  # torchvision: "Dataset not found" or, for CIFAR-10, "... or corrupted"
            if not download:
                raise DatasetUnavailableError(_missing_message(name, root)) from None
            try:
                root.mkdir(parents=True, exist_ok=True)
                ds = cls(root=str(root), train=train, transform=transform, download=True)
            except Exception:  # network errors come in many types (URLError, RuntimeError, OSError)
                raise DatasetUnavailableError(_missing_message(name, root)) from None
    return ds


@contextlib.contextmanager
def download_lock(root: Path | str, name: str = "dataset", *, timeout: float = 1800.0) -> Iterator[Path | None]:
    """Hold ``root/.<name>.lock`` (``locks.hold``): a machine's ranks download in turn; yields it (None: read-only)."""
    path = Path(root) / f".{name}.lock"
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(locks.hold(path, wait=timeout, what=f"the download lock {path}"))
        except locks.Held:
            raise
        except OSError:  # read-only location: only reading happens there, no lock needed
            held = None
        yield held


def _missing_message(name: str, root: Path) -> str:
    folder = root / spec(name).folder
    if folder.is_dir() and any(folder.iterdir()):
        where = (f"The real {spec(name).name} files in {folder} failed torchvision's check "
                 "(incomplete, damaged, or not the original archive) and could not be downloaded again "
                 f"(offline?). Delete {folder} and download it again on a connected machine")
    else:
        where = (f"The real {spec(name).name} dataset is not in {root} and could not be downloaded "
                 "(offline?). Either download it on a connected machine into that folder")
    return (f"{where} (or point COURSE_DATA_DIR at a copy), or run on the synthetic stand-in with "
            "`COURSE_DATA=standin` (the `COURSE_PROFILE=smoke` default).")


def is_standin(dataset: Dataset) -> bool:
    """True when the dataset (or the dataset under a Subset) is a synthetic stand-in."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return bool(getattr(dataset, "is_standin", False))


def take(dataset: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """A seeded random subset of ``n`` items (the whole dataset when n is None or too big)."""
    if n is None or n >= len(dataset):
        return dataset
    if n <= 0:
        raise ValueError("n must be positive")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    return Subset(dataset, order[:n].tolist())


def heavy_pipeline(size: int = 224):
    """The book's expensive training transform (resize, crop, flip, rotate, blur, normalize), scaled to ``size``."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(round(size * 255 / 224)),
        transforms.CenterCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.RandomRotation(20),
        transforms.GaussianBlur(3),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class EpochShuffleSampler(Sampler[int]):
    """Shuffles by (seed, epoch); ``set_epoch(epoch, start=k)`` skips ``k`` samples, for a resume mid-epoch."""

    def __init__(self, length: int, seed: int = 0, shuffle: bool = True):
        self.length, self.seed, self.shuffle = length, seed, shuffle
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start:])

    def __len__(self) -> int:
        return self.length - self.start


def make_loader(dataset: Dataset, batch_size: int, *, train: bool, seed: int = 0, **options: Any) -> DataLoader:
    """A DataLoader (``options``: num_workers, pin_memory, ...) shuffled per epoch (seeded) when ``train``."""
    sampler = EpochShuffleSampler(len(dataset), seed=seed, shuffle=train)
    return DataLoader(dataset, batch_size, sampler=sampler, **options)


def loading_pass(dataset: Dataset, batch_size: int, **options) -> Callable[[], tuple[float, dict[str, float]]]:
    """A round of loading alone for ``measure.interleaved``: one pass of a new ``make_loader``, images per second."""
    def one_round() -> tuple[float, dict[str, float]]:
        loader = make_loader(dataset, batch_size, train=True, **options)
        start = time.perf_counter()
        images = sum(len(inputs) for inputs, *_ in loader)
        took = time.perf_counter() - start
        return took, {"images_per_s": images / took}
    return one_round
