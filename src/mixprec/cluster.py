"""Connecting to Ray: import it when a call asks for it, join a cluster or start one, and say why it could not.

Two stages use a Ray cluster: calibration over shards or a ``ray.data.Dataset`` (``calibrate/shards.py``)
and the search's trials (``searching/distributed.py``). Both need the same three things, written once
here, below both of them (calibrate/ is an earlier stage than searching/, so neither may hold it):

* :func:`import_ray`: Ray is an optional extra (``pip install 'mixprec[ray]'``), imported only when a
  call asks for it; without it a ConfigError says what to install and how to do without;
* :func:`connect`: ``"local"`` starts a cluster on this machine, ``"auto"`` or ``"ray://host:port"`` joins
  one; a process already connected (``ray.init`` by the caller) keeps its cluster. Returns whether this
  call started the connection (then the caller shuts it down when done);
* :func:`first_line`: the first line of an exception's text, for one-paragraph errors.
"""

from __future__ import annotations

from .errors import ConfigError


def import_ray(what: str, instead: str):
    """``import ray``; ConfigError naming ``what`` needs it ("mixprec.search with ray_address='local'") and
    ``instead``, how to do without ("leave ray_address out to search in this process")."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            f"{what} runs on a Ray cluster, but Ray is not installed here. Install it with "
            f"`pip install 'mixprec[ray]'`, or {instead}."
        ) from e
    return ray


def connect(ray, address: str, *, what: str, num_cpus: int | None = None) -> bool:
    """Connect this process to the cluster at ``address`` unless it is connected already; True when this call
    connected it (the caller then ``ray.shutdown()`` s when done). ``num_cpus`` sizes a "local" cluster (None:
    the machine's CPUs). ConfigError, in the words of ``what`` ("mixprec.search"), when it cannot."""
    if ray.is_initialized():
        return False
    try:
        if address == "local":
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except Exception as e:  # ray raises ConnectionError, RuntimeError, ValueError here
        raise ConfigError(
            f"{what} could not connect to the Ray cluster at {address!r}: {type(e).__name__}: "
            f"{first_line(e)}. Start one with `ray start --head` (then ray_address='auto'), give its "
            "'ray://host:port', or use ray_address='local'."
        ) from e
    return True


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
