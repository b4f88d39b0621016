"""Constituency trees and the bracketed notation of the Penn Treebank.

`(S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .))`: a bracket holds a label and either
one word (a preterminal: a part-of-speech tag over its word) or further brackets. A
treebank file (`.mrg`) holds many such trees, each spread over several lines, usually
under an unlabelled root: `( (S ...) )`.

One reader serves treebank files, gold files and other parsers' output. It never fails
on a string: what is not a well-formed tree is repaired, and each repair is named in
`Parsed.repairs`, so that a treebank file can refuse any repair while a scorer counts
them. The rules:

- `unmatched-close`: a `)` with no bracket open is dropped;
- `unclosed`: brackets still open at the end are closed there;
- `loose-word`: a word beside other children, or several words in one bracket, becomes
  its own preterminal tagged `XX` (a tree has words only under preterminals);
- `empty`: `()` and brackets left without any word are dropped.

Every walk over a tree is iterative: a model's output can nest deeper than Python's
recursion limit. (The dataclass's own `==` and `repr` do recurse; the code never
compares trees, only their bracketed strings.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# The preterminal of a word whose tag is not known: Vinyals et al.'s normalised POS tag,
# and the tag of words the reader has to wrap.
PLACEHOLDER_TAG = "XX"
# The root of a tree as EVALB's gold files have it (tgrep writes it; COLLINS.prm deletes it)
TOP = "TOP"
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass(frozen=True)
class Tree:
    """A labelled bracket; a preterminal is a tree whose only child is its word."""

    label: str
    children: tuple[Tree | str, ...] = ()

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def preterminals(self) -> list[tuple[str, str]]:
        """(tag, word) of every preterminal, left to right."""
        out: list[tuple[str, str]] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                continue
            if node.is_preterminal:
                out.append((node.label, str(node.children[0])))
            else:
                stack.extend(reversed(node.children))
        return out

    def words(self) -> list[str]:
        return [word for _, word in self.preterminals()]

    def bracketed(self) -> str:
        """The tree on one line: `(S (NP (DT The) (NN dog)) (VP (VBZ barks)))`."""
        parts: list[str] = []
        stack: list[Tree | str | None] = [self]  # None closes the bracket opened last
        while stack:
            node = stack.pop()
            if node is None:
                parts.append(")")
            elif isinstance(node, str):
                parts.append(" " + node)
            else:
                parts.append(" (" + node.label)
                stack.append(None)
                stack.extend(reversed(node.children))
        return "".join(parts)[1:]


@dataclass
class _Open:
    """A bracket being read: its label and the children found so far."""

    label: str
    children: list[Tree | str] = field(default_factory=list)


@dataclass(frozen=True)
class Parsed:
    """The trees read from a text and the repairs they needed (see the module's rules)."""

    trees: list[Tree]
    repairs: tuple[str, ...] = ()


def read_trees(text: str) -> Parsed:
    """Every top-level bracket of `text` as a tree, repaired where it must be."""
    repairs: set[str] = set()
    trees: list[Tree] = []
    stack: list[_Open] = []
    tokens = _TOKEN.findall(text)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "(":
            label = ""
            if i < len(tokens) and tokens[i] not in ("(", ")"):
                label = tokens[i]
                i += 1
            stack.append(_Open(label))
        elif token == ")":
            if not stack:
                repairs.add("unmatched-close")
                continue
            _close(stack, trees, repairs)
        elif stack:
            stack[-1].children.append(token)
        else:
            repairs.add("loose-word")  # a word outside any bracket: kept as a tree of its own
            trees.append(Tree(PLACEHOLDER_TAG, (token,)))
    if stack:
        repairs.add("unclosed")
        while stack:
            _close(stack, trees, repairs)
    return Parsed(trees, tuple(sorted(repairs)))


def _close(stack: list[_Open], trees: list[Tree], repairs: set[str]) -> None:
    """Close the innermost open bracket, adding it to its parent (or to `trees`)."""
    node = stack.pop()
    children = node.children
    words = [c for c in children if isinstance(c, str)]
    if words and not (len(children) == 1 and node.label):
        # several words, a word beside brackets, or a word under an unlabelled bracket
        repairs.add("loose-word")
        children = [Tree(PLACEHOLDER_TAG, (c,)) if isinstance(c, str) else c for c in children]
    if not children:
        repairs.add("empty")
        return
    tree = Tree(node.label, tuple(children))
    if stack:
        stack[-1].children.append(tree)
    else:
        trees.append(tree)


def read_tree(text: str) -> tuple[Tree | None, tuple[str, ...]]:
    """One line's tree; None for a line without any word. Several top-level brackets
    become the children of one `TOP` root (named `several-roots`), which EVALB's
    COLLINS.prm does not count: evalb.c reads such a line as brackets side by side."""
    parsed = read_trees(text)
    if not parsed.trees:
        return None, parsed.repairs
    if len(parsed.trees) == 1:
        return parsed.trees[0], parsed.repairs
    return Tree(TOP, tuple(parsed.trees)), tuple(sorted({*parsed.repairs, "several-roots"}))


def iter_nodes(tree: Tree) -> Iterator[Tree]:
    """Every bracket of `tree`, preterminals included, in pre-order."""
    stack: list[Tree] = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed([c for c in node.children if isinstance(c, Tree)]))
