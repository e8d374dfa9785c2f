"""Save and load what ``compile_for_generation`` returns: its programs, config and generation config in one directory.

A ``CausalLMProgram`` is one program, a ``Seq2SeqLMProgram`` two; each program is its own ``.mixprec.pt2``
file (``mixprec.save``: ``mixprec report``/``mixprec run`` read each), next to the model's ``config.json``
and ``generation_config.json`` as transformers writes them and a small ``mixprec-generation.json`` naming
the files. :func:`load` needs neither the model's code nor its weights: it reads only regular files inside the
directory (``directory.py``), checks ``config.json`` and ``generation_config.json`` itself before transformers
builds the configs from the checked fields (``configs.py``: no code from the directory, no remote code), and
``mixprec.load`` checks each program file as it checks any file (README "Security").
"""

from __future__ import annotations

import json
import pathlib

from ..errors import FileFormatError
from . import configs
from .directory import entry, read_small
from ..output.serialize import load as load_program
from ..output.serialize import save as save_program

INDEX = "mixprec-generation.json"
_MAX_INDEX = 64 << 10  # mixprec-generation.json is ~150 bytes
_FILES = {"causal": {"program": "program.mixprec.pt2"},
          "seq2seq": {"encoder": "encoder.mixprec.pt2", "decoder": "decoder.mixprec.pt2"}}


def save(lm, directory) -> pathlib.Path:
    """Write ``lm`` (from ``compile_for_generation``) into ``directory`` (created if needed); returns its path."""
    from .causal import CausalLMProgram

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    kind = "causal" if isinstance(lm, CausalLMProgram) else "seq2seq"
    if kind == "causal":
        programs = {"program": lm.program}
    else:
        programs = {"encoder": lm.encoder_program, "decoder": lm.decoder_program}
    for part, program in programs.items():
        save_program(program, directory / _FILES[kind][part])
    lm.config.to_json_file(directory / "config.json")
    lm.generation_config.to_json_file(directory / "generation_config.json")
    (directory / INDEX).write_text(json.dumps({"format": 1, "kind": kind, "files": _FILES[kind]}, indent=1))
    return directory


def load(directory, *, backend: str | None = None):
    """The ``CausalLMProgram`` or ``Seq2SeqLMProgram`` :func:`save` wrote into ``directory``; ``backend`` as for
    ``mixprec.load`` (default: the one each program was compiled for). A directory from anyone is safe to load:
    regular files only (``directory.py``), configs checked before transformers sees them (``configs.py``), and
    every refusal a FileFormatError."""
    from .causal import CausalLMProgram
    from .seq2seq import program_class

    directory = pathlib.Path(directory)
    index = directory / INDEX
    try:
        meta = configs.read_json(read_small(directory, INDEX, _MAX_INDEX), str(index))
    except FileFormatError as e:
        raise FileFormatError(f"{directory} has no readable {INDEX}: it is not a directory mixprec.hf.save wrote "
                              f"({e})") from e
    kind = meta.get("kind") if isinstance(meta.get("kind"), str) else None
    if meta.get("format") != 1 or kind not in _FILES or meta.get("files") != _FILES[kind]:
        raise FileFormatError(f"{index} is not one mixprec.hf.save writes (format 1, kind causal or seq2seq).")
    config, generation_config = (
        read(read_small(directory, name, configs.MAX_BYTES), str(directory / name))
        for read, name in ((configs.model_config, "config.json"), (configs.generation_config, "generation_config.json"))
    )
    programs = {part: load_program(entry(directory, name), backend=backend) for part, name in _FILES[kind].items()}
    try:
        if kind == "causal":
            return CausalLMProgram(programs["program"], config, generation_config=generation_config)
        return program_class(config)(programs["encoder"], programs["decoder"], config,
                                     generation_config=generation_config)
    except Exception as e:  # a program that is not what compile_for_generation writes, a config it cannot take
        raise FileFormatError(f"{directory}: its programs and config do not make a {kind} LM ({type(e).__name__}: "
                              f"{e})") from e
