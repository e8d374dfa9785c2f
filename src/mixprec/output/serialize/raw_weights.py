"""Saving a program's weights from their storage: torch 2.13's private ``_save_raw_tensors``, replaced while saving.

torch's own version copies every weight into a ``bytes`` object before writing it, so the peak memory of a save
grows by the largest weight; ``save`` streams instead (issue 11). The replacement is a patch of a private torch
function, so it is kept here, apart from the rest of saving: it is applied only when torch has every helper it uses,
only for the duration of one save, and under a lock, because a module attribute is process-wide and two threads
saving at once must not restore each other's original.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def written_in_place():
    """While saving, torch 2.13's ``_save_raw_tensors`` writes each CPU weight from its storage.

    torch's own version first copies every weight into a ``bytes`` object (``_get_raw_tensor_bytes``), so the
    peak memory of a save grows by the largest weight (262 MB for a Llama embedding in fp32). The replacement
    is the same function with the record written from the storage's memory (``PyTorchFileWriter.write_record``
    takes a storage); the archive is byte for byte the same (tests/output/serialize/test_streaming.py). Where torch
    does not have the helpers it uses, torch's function is left alone.
    """
    from torch.export.pt2_archive import _package as package

    needed = ("_save_raw_tensors", "Weights", "group_weights", "get_complete_tensor", "serialize_tensor_meta",
              "_get_raw_tensor_bytes", "_is_fake_tensor", "schema")  # fmt: skip
    if not all(hasattr(package, name) for name in needed):
        yield
        return

    def save_raw_tensors(raw_items, model_name, archive_writer, config, directory, filename_prefix, idx):
        if not raw_items:
            return idx
        weights = {model_name: package.Weights(raw_items)}
        for group in package.group_weights(weights):
            complete = package.get_complete_tensor(group, weights)
            path_name = f"{filename_prefix}{idx}"
            archive_path = os.path.join(directory, path_name)
            if complete.device.type == "cpu" and not package._is_fake_tensor(complete) and complete.data_ptr():
                storage = complete.untyped_storage()
                archive_writer.archive_file.write_record(archive_path, storage, storage.nbytes())
            else:
                archive_writer.write_bytes(archive_path, package._get_raw_tensor_bytes(complete))
            idx += 1
            for _, fqn in group:
                tensor, _ = weights[model_name].get_weight(fqn)
                config[fqn] = package.schema.PayloadMeta(
                    path_name=path_name,
                    is_param=isinstance(tensor, torch.nn.Parameter),
                    use_pickle=False,
                    tensor_meta=package.serialize_tensor_meta(tensor),
                )
        return idx

    with _PATCH_LOCK:
        original = package._save_raw_tensors
        package._save_raw_tensors = save_raw_tensors
        try:
            yield
        finally:
            package._save_raw_tensors = original
