"""What a draw is: ``DataSpec`` (the settings), ``Sample`` (the result), data set names.

``DataSpec`` declares each setting once, with its default, unit, bounds and help text
(``engine.runtime.settings``), and validates itself on construction. ``parse_dataset`` reads the
``dataset`` field; ``draw`` is the seeded subsampling every source uses. numpy and torch are
imported where a draw is made, not here: configs and ``--help`` read ``DataSpec`` without them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.errors import BadInput
from ..runtime.settings import setting, validate
from .folders import expand_path

if TYPE_CHECKING:  # annotations only
    import numpy as np
    import torch

DATASETS = ("mnist", "fashion-mnist", "cifar10", "synthetic")  # plus a path to a user .npz
DECAYS = ("geometric", "linear", "power")  # eigenvalue profiles of the synthetic Gram
CLASSES = {  # fashion-mnist as torchvision's FashionMNIST.classes; cifar10 as batches.meta
    "mnist": tuple(str(i) for i in range(10)),
    "fashion-mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                      "Shirt", "Sneaker", "Bag", "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                "ship", "truck"),
}


def _check_dataset(text: str) -> None:
    """A name, or a .npz path the file system could hold: ``~user`` known, names within the
    length limits, and not an existing folder, FIFO or device (a FIFO would block every reader,
    the run's estimate included). A missing file is left to ``load_sample`` (DataMissing)."""
    if not text.strip():
        raise BadInput(f"dataset must name a data set ({', '.join(DATASETS)}, NAME:a-b for two "
                       "classes, or a path to a .npz file); got an empty string")
    if text.strip().lower().endswith(".npz"):
        path = expand_path(text.strip(), "dataset")
        try:
            st = os.stat(path)
        except OSError:  # absent (DataMissing when it is read), or unreadable: said when read
            return
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"dataset {path} is not a regular file (a folder, FIFO or device); "
                           "give the path of a .npz file")


@dataclass(frozen=True)
class DataSpec:
    """One draw of a data set; its canonical form is part of every cache key."""

    dataset: str = setting(      # name in DATASETS, "name:a-b" for two classes, or a .npz path
        "mnist", "data set: one of mnist, fashion-mnist, cifar10, synthetic; NAME:a-b for two "
        "classes (e.g. mnist:3-8); or a path to a .npz file holding X and y", check=_check_dataset)
    n: int = setting(            # training points drawn from the train split
        400, "training points drawn from the train split", unit="points", lo=2, hi=60000)
    n_test: int = setting(       # test points drawn from the test split (never overlaps train)
        200, "test points drawn from the test split (never overlapping the training points)",
        unit="points", lo=1, hi=10000)
    seed: int = setting(         # draw seed; same spec -> same sample
        0, "seed of the draw: the same spec gives the same sample", lo=0, hi=2**31 - 1)
    normalize: bool = setting(   # rows l2-normalised before they enter a network (models apply it)
        True, "scale each input row x to unit ℓ2 norm, x / ‖x‖₂, before it enters a network "
        "(the models apply it; the drawn data stay raw), so every point lies on the unit sphere "
        "as the NTK theory assumes")
    synthetic_d: int = setting(  # synthetic only: input dimension
        64, "synthetic only: input dimension d", unit="features", lo=1, hi=4096)
    synthetic_kappa: float = setting(  # synthetic only: max/min nonzero eigenvalue of G = X Xᵀ
        100.0, "synthetic only: condition number of the Gram G = X Xᵀ (largest over smallest "
        "nonzero eigenvalue)", lo=1, hi=1e12)
    synthetic_decay: str = setting(  # synthetic only: eigenvalue profile, one of DECAYS
        "geometric", "synthetic only: how the Gram's eigenvalues fall from 1 to 1/kappa",
        choices=DECAYS)
    synthetic_classes: int = setting(  # synthetic only: classes of the random linear teacher
        10, "synthetic only: classes of the random linear teacher", unit="classes", lo=2, hi=100)

    def __post_init__(self):
        validate(self)
        for name in ("n", "n_test", "seed", "synthetic_d", "synthetic_classes"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints -> int
        object.__setattr__(self, "synthetic_kappa", float(self.synthetic_kappa))


@dataclass(frozen=True, eq=False)
class Sample:
    """A drawn data set. Tensors are float64 (inputs) and int64 (labels 0..c-1) on the CPU."""

    X: torch.Tensor              # (n, d) raw inputs; images: pixels in [0, 1], C,H,W order
    y: torch.Tensor              # (n,) labels 0..c-1
    X_test: torch.Tensor         # (n_test, d)
    y_test: torch.Tensor         # (n_test,)
    class_names: tuple[str, ...]  # original names of labels 0..c-1 (a pair: a, b in order)
    image_shape: tuple[int, int, int] | None  # (C, H, W); None for synthetic / flat npz
    box: tuple[float, float] | None  # valid input range for attacks; None if unbounded
    source: str                  # folder or file read, or "generated"
    spec: DataSpec

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def binary(self) -> bool:
        return self.n_classes == 2

    def class_counts(self) -> dict[str, tuple[int, int]]:
        """Class name -> (training count, test count)."""
        import torch

        tr = torch.bincount(self.y, minlength=self.n_classes).tolist()
        te = torch.bincount(self.y_test, minlength=self.n_classes).tolist()
        return {name: (tr[i], te[i]) for i, name in enumerate(self.class_names)}


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    available: bool
    where: str    # folder holding the files (or that would hold them), or "generated"
    reason: str   # one line for the user


def parse_dataset(name: str) -> tuple[str, tuple[str, str] | None]:
    """Split ``"mnist:3-8"`` into ``("mnist", ("3", "8"))``; ``"mnist"`` gives ``("mnist", None)``.

    Class parts are returned as written (index or case-insensitive name) after checking them
    against the data set's classes. A path ending in ``.npz`` is returned unchanged with None.
    Raises BadInput for unknown data sets or classes, listing what is allowed.
    """
    text = str(name).strip()
    if text.lower().endswith(".npz"):
        return text, None
    base, sep, pair = text.partition(":")
    base = base.strip().lower()
    if base not in DATASETS:
        raise BadInput(f"unknown data set {name!r}: allowed are {', '.join(DATASETS)}, "
                       "NAME:a-b for two classes (e.g. mnist:3-8), or a path to a .npz file")
    if not sep:
        return base, None
    known = CLASSES.get(base)
    cuts = [(pair[:i].strip(), pair[i + 1:].strip()) for i, ch in enumerate(pair) if ch == "-"]
    cuts = [c for c in cuts if c[0] and c[1]]
    if known is not None and len(cuts) > 1:  # names like "T-shirt/top" hold a hyphen
        cuts = [c for c in cuts if all(class_index(t, known) is not None for t in c)] or cuts[:1]
    if len(cuts) != 1:
        raise BadInput(f"cannot read the class pair in {name!r}: write {base}:a-b with two "
                       "class indices or names, e.g. mnist:3-8")
    a, b = cuts[0]
    if known is not None:
        if resolve_class(a, known, base) == resolve_class(b, known, base):
            raise BadInput(f"the pair in {name!r} names the same class twice")
    elif not (a.isdigit() and b.isdigit()) or int(a) == int(b):  # synthetic: class indices
        raise BadInput(f"synthetic classes are indices 0..synthetic_classes-1; got {name!r}")
    return base, (a, b)


def class_index(token: str, names: tuple[str, ...]) -> int | None:
    """Index of a class given by index or (case-insensitive) name; None if unknown."""
    if token.isdigit() and int(token) < len(names):
        return int(token)
    lowered = [c.lower() for c in names]
    return lowered.index(token.lower()) if token.lower() in lowered else None


def resolve_class(token: str, names: tuple[str, ...], base: str) -> int:
    """Like ``class_index``, but raises BadInput listing the classes of `base`."""
    i = class_index(token, names)
    if i is None:
        raise BadInput(f"unknown class {token!r} for {base}: allowed are indices "
                       f"0-{len(names) - 1} or names {', '.join(names)}")
    return i


def draw(pool: np.ndarray, k: int, seed: int, stream: int, what: str, where: str) -> np.ndarray:
    """First k of a seeded permutation of the candidate indices `pool` (so a larger k extends
    a smaller draw). `what`/`where` name the setting and the source in the BadInput raised
    when k exceeds the pool."""
    import numpy as np

    if k > len(pool):
        raise BadInput(f"{what}={k} is more than the {len(pool)} points in {where}; "
                       f"the maximum is {len(pool)}")
    return pool[np.random.default_rng([seed, stream]).permutation(len(pool))[:k]]
