"""Where a study's files live, and the command lines that reach a study again: the bottom layer,
which imports nothing else of study.

- `study.storage.storage`: the facade every other folder uses: `StudyPaths`, the tables read
  whole, files read and replaced atomically, local or on an object store;
- `study.storage.paths`: `StudyPaths`, one property a file of a study under its storage root;
- `study.storage.filesystems`: a storage root as a path or URI and the pyarrow filesystem behind it;
- `study.storage.files`: whole files read in one go, replaced atomically, created only once;
- `study.storage.commands`, `study.storage.hints`: ``ponder-study`` as the user's shell reaches
  it, and the command lines printed to paste (which name ``--storage`` when not the default);
- `study.storage.lazy`: how this folder and the three above it re-export their main
  module's names.

`study.storage.storage`'s names (its ``__all__``) are re-exported here, on first use (a study
pickled before the folders names ``study.storage.StudyPaths``), and the entry point imports
`study.storage.commands` before anything heavy: importing a module of this folder imports no other
(but `study.storage.lazy`). No Ray, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.storage.lazy import public_names

if TYPE_CHECKING:  # its names, typed, for mypy and editors
    from study.storage.storage import *  # noqa: F403

__getattr__ = public_names(__name__, "study.storage.storage")
