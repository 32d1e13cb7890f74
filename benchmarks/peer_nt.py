"""neural-tangents' empirical NTK of the engine's two-layer ReLU head, driven by engine.bench.

``engine.bench.peer_neural_tangents`` runs this under the Python of a separate environment
(``ENGINE_NT_PYTHON``) with neural-tangents 0.6.5 and jax/jaxlib 0.4.28 (see README.md here);
it never imports torch or the engine. Arguments: an .npz with ``phi`` (n, d), ``W`` (m, d)
and ``a`` (m, 1), all float32 (the engine's rows, weights and readout signs), and the
``nt.NtkImplementation`` name. The kernel is the engine's: f(x) = relu(x Wᵀ) a / √m, with
respect to W only. One JSON line answers each request on stdin:

- at start: {"ready": true, versions, "backend"} or {"skip": reason} when the imports fail;
- ``run``: computes K(phi, phi) once and answers {"wall": s, "cpu": s} (this process's CPU);
- ``save PATH``: writes the last kernel as float64 .npy and answers {"saved": PATH};
- ``quit`` (or end of input): exits.
"""

import json
import sys
import time
import types


def _say(obj) -> None:
    print(json.dumps(obj), flush=True)


def main() -> None:
    path, implementation = sys.argv[1], sys.argv[2]
    try:
        # neural_tangents/__init__ imports .experimental, which imports TensorFlow through
        # jax2tf; the empirical NTK does not use it, and TensorFlow is a 600 MB install.
        sys.modules.setdefault("neural_tangents.experimental", types.ModuleType("neural_tangents.experimental"))
        import jax
        import jaxlib
        import neural_tangents as nt
        import numpy as np
    except Exception as exc:  # noqa: BLE001 -- any import failure is a reason to skip
        _say({"skip": f"cannot import neural-tangents and jax: {type(exc).__name__}: {exc}"[:300]})
        return
    from jax.extend import source_info_util
    from jax.interpreters import ad

    # jax 0.4.26 removed these two aliases from jax.interpreters.ad; neural-tangents 0.6.5's
    # structured derivatives still read them there (they are the same objects).
    for name, value in (("source_info_util", source_info_util), ("config", jax.config)):
        if not hasattr(ad, name):
            setattr(ad, name, value)
    data = np.load(path)
    phi, a = jax.numpy.asarray(data["phi"]), jax.numpy.asarray(data["a"])
    Wt = jax.numpy.asarray(np.ascontiguousarray(data["W"].T))  # (d, m): x @ Wt is a plain dot, no transpose
    scale = np.float32(1 / np.sqrt(Wt.shape[1]))

    def f(Wt, x):  # the engine's TwoLayerReLU, param "ntk", as a function of its first layer
        return jax.nn.relu(x @ Wt) @ a * scale

    ntk_fn = jax.jit(nt.empirical_ntk_fn(f, trace_axes=(-1,), vmap_axes=0,
                                         implementation=getattr(nt.NtkImplementation, implementation)))
    _say({"ready": True, "neural_tangents": nt.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "numpy": np.__version__, "backend": jax.default_backend()})
    K = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "run":
            w0, c0 = time.perf_counter(), time.process_time()
            K = ntk_fn(phi, None, Wt).block_until_ready()
            _say({"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0})
        elif cmd[0] == "save":
            np.save(cmd[1], np.asarray(K, dtype=np.float64))
            _say({"saved": cmd[1]})
        else:
            _say({"error": f"unknown request {cmd[0]!r}; allowed: run, save PATH, quit"})


if __name__ == "__main__":
    main()
