"""Rebuilding the nested state dict from its flattened entries, as the C++
unflatten_state_dict does (src/state/state_dict.cpp).

Each entry's path is a list of dict keys (str) and list indices (int). A container whose
children are indices becomes a Python list, one whose children are keys a dict: the
C++ StateDict had a list exactly there (a list holding tensors or containers is
flattened element by element; a list of scalars is one leaf, already a Python list).
"""

from typing import Any, Dict, Iterable, List, Sequence, Tuple

from .errors import FormatError
from .metadata import PathElement


class _Node:
    __slots__ = ("is_leaf", "leaf", "is_list", "children")

    def __init__(self):
        self.is_leaf = False
        self.leaf = None
        self.is_list = None  # decided by the first child's path element
        self.children: Dict[PathElement, "_Node"] = {}

    def child(self, element: PathElement, prefix: Sequence[PathElement]) -> "_Node":
        is_index = isinstance(element, int)
        if self.is_list is None:
            self.is_list = is_index
        elif self.is_list != is_index:
            raise FormatError(f"state dict path {list(prefix)} mixes list indices and dict keys")
        return self.children.setdefault(element, _Node())

    def build(self, path: List[PathElement]) -> Any:
        if self.is_leaf:
            return self.leaf
        if not self.is_list:
            return {key: node.build(path + [key]) for key, node in self.children.items()}
        if sorted(self.children) != list(range(len(self.children))):
            raise FormatError(f"state dict list at {path} has indices {sorted(self.children)}, "
                              f"not 0 to {len(self.children) - 1}")
        return [self.children[i].build(path + [i]) for i in range(len(self.children))]


def unflatten(leaves: Iterable[Tuple[Sequence[PathElement], Any]]) -> Dict[str, Any]:
    """The nested dict of (path, value) leaves. Raises FormatError when the paths do not
    describe one tree (a leaf that is also a container, a path given twice, a list
    with gaps, a container with both keys and indices)."""
    root = _Node()
    for path, value in leaves:
        node = root
        for depth, element in enumerate(path):
            if node.is_leaf:
                raise FormatError(f"state dict entry {list(path[:depth])} is both a value and a container")
            node = node.child(element, path[:depth + 1])
        if node.is_leaf or node.children:
            raise FormatError(f"state dict path {list(path)} is given twice")
        node.is_leaf = True
        node.leaf = value
    return root.build([]) if root.children else {}
