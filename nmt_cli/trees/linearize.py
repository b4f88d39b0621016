"""Trees as token sequences, the way the paper's section 6.3 feeds them to the Transformer.

The paper: "we trained a 4-layer transformer with d_model = 1024 on the Wall Street
Journal (WSJ) portion of the Penn Treebank", the task set up as in Vinyals et al. 2015,
"Grammar as a Foreign Language" (its reference [37]): the source is the sentence's words,
the target the tree "linearized ... following a depth-first traversal order", every
opening bracket carrying its label and every closing bracket labelled too, and, since POS
tags are not part of the F1 score, every POS tag replaced by "XX". Their example:

    John has a dog .  ->  (S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S
    as trained here   ->  (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S

Exactly what `normalize` does to a treebank tree before it is linearized, in this order:

1. the root is removed: the treebank's unlabelled bracket (or `TOP`/`ROOT`) around each
   sentence; its children are linearized one after the other (nearly always one `S`);
2. traces are removed: every preterminal tagged `-NONE-`, and every bracket that then
   holds no word (`(NP-SBJ (-NONE- *-1))` goes entirely); their words are not source
   words either;
3. function tags and co-indices are removed from bracket labels: the label is cut at its
   first `-` or `=` (`NP-SBJ-1` -> `NP`, `PP-LOC=2` -> `PP`, `S-TPC-1` -> `S`; `PRT|ADVP`
   and labels that begin with `-` stay whole), as EVALB does before it compares labels;
4. POS tags become `XX` in the target (the gold tree keeps them for scoring), or, with
   `leaves="words"`, the preterminal is written as its word (below).

Nothing else changes: unary chains (`(S (VP ...))`, `(NP (NP ...))`) stay, words are
not lower-cased, and no label is merged (EVALB's ADVP = PRT is a scoring rule).
Steps 2 and 3 are what the standard evaluation ignores (COLLINS.prm deletes `-NONE-` and
EVALB strips function tags), so the model learns exactly the brackets it is scored on.

Leaves: the paper's targets hold `XX` for every word, so the decoder never sees which word
it has reached and must count. Trained on a few thousand trees, such a model writes trees
of one shape whatever the sentence (BENCHMARKS.md). `leaves="words"` writes each word in
its place instead, `(S (NP John )NP (VP has (NP a dog )NP )VP . )S`: the target is longer
by the words' extra subword pieces, and the decoder reads the sentence as it brackets it,
as the parsers that read a tree as a language model do (Choe and Charniak 2016). The
words are copied, never chosen: the tree constraint (constraint.py) forces each one.

`delinearize` turns a model's output back into a tree over the source words, re-inserting
them in order at the leaves (`XX` or the word) as Vinyals et al. do. An output that is not a
well-formed linearization is repaired by the rules in its docstring, each one named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nmt_cli.trees.tree import PLACEHOLDER_TAG, TOP, Tree, iter_nodes

TRACE = "-NONE-"
ROOT_LABELS = ("", TOP, "ROOT")
LEAVES = ("xx", "words")  # what a target holds for each word: XX (the paper's), the word


def base_label(label: str) -> str:
    """A bracket label without function tags or co-indices (step 3 of `normalize`)."""
    if label.startswith("-"):
        return label  # -NONE-, -LRB-: names, not tagged labels
    for i, char in enumerate(label):
        if char in "-=":
            return label[:i]
    return label


def _strip(tree: Tree, pos_tags: bool) -> Tree | None:
    """Steps 2-4 on one subtree; None when it holds nothing but traces."""
    done: dict[int, Tree | None] = {}
    for node in reversed(list(iter_nodes(tree))):  # every node after its descendants
        if node.is_preterminal:
            tag = node.label if pos_tags else PLACEHOLDER_TAG
            done[id(node)] = None if node.label == TRACE else Tree(tag, node.children)
            continue
        kids = tuple(k for c in node.children if (k := done[id(c)]) is not None)
        done[id(node)] = Tree(base_label(node.label), kids) if kids else None
    return done[id(tree)]


def _under_root(tree: Tree) -> tuple[Tree, ...]:
    """The sentence's constituents: the children of its root bracket (unlabelled, TOP or
    ROOT), or the tree itself when it has none (step 1)."""
    if tree.label in ROOT_LABELS and not tree.is_preterminal:
        return tuple(c for c in tree.children if isinstance(c, Tree))
    return (tree,)


def normalize(tree: Tree, pos_tags: bool = False) -> list[Tree]:
    """The top-level constituents a treebank tree is linearized from (steps 1-4 above);
    `pos_tags=True` keeps the tags (step 4 skipped)."""
    stripped = (_strip(top, pos_tags) for top in _under_root(tree))
    return [t for t in stripped if t is not None]


def source_words(tree: Tree) -> list[str]:
    """The sentence as the model reads it: every word that is not a trace."""
    return [word for tag, word in tree.preterminals() if tag != TRACE]


def linearize(tree: Tree, leaves: str = "xx") -> str:
    """The target sequence of a treebank tree: `(S (NP XX XX )NP (VP XX )VP XX )S`, or
    with `leaves="words"` `(S (NP The dog )NP (VP barked )VP . )S`."""
    parts: list[str] = []
    stack: list[Tree | str] = list(reversed(normalize(tree)))
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            parts.append(node)
        elif node.is_preterminal:
            parts.append(str(node.children[0]) if leaves == "words" else PLACEHOLDER_TAG)
        else:
            parts.append("(" + node.label)
            stack.append(")" + node.label)
            stack.extend(reversed(node.children))
    return " ".join(parts)


def evaluation_tree(tree: Tree) -> Tree:
    """A treebank tree as EVALB's gold file has it: under a `TOP` root, with traces and
    function tags left for the scorer's COLLINS.prm rules to remove."""
    return Tree(TOP, _under_root(tree))


@dataclass
class _Node:
    """A bracket of an output being read back."""

    label: str
    children: list[_Node | Tree] = field(default_factory=list)


def _freeze(root: _Node, repairs: set[str]) -> Tree | None:
    """The finished tree, without brackets that hold no word."""
    order: list[_Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(c for c in node.children if isinstance(c, _Node))
    done: dict[int, Tree | None] = {}
    for node in reversed(order):  # every node after its descendants
        kids = [c if isinstance(c, Tree) else done[id(c)] for c in node.children]
        present = tuple(k for k in kids if k is not None)
        if not present:
            repairs.add("empty-bracket")
        done[id(node)] = Tree(node.label, present) if present else None
    return done[id(root)]


@dataclass(frozen=True)
class Delinearized:
    """A model output turned into a tree over the source words, and what was repaired."""

    tree: Tree
    repairs: tuple[str, ...] = ()


def delinearize(output: str, words: list[str]) -> Delinearized:
    """The tree a linearized output describes, with `words` re-inserted in order at its
    leaves (`XX` or the word itself), under a `TOP` root.

    Tokens: `(LABEL` opens a bracket, `)` or `)LABEL` closes the innermost open one
    (whatever label it names), anything else is a word's leaf. An output that is not
    a well-formed linearization of `len(words)` words is repaired by these rules, each
    named in `repairs` when it applied:

    - `unmatched-close`: a closing bracket with no bracket open is dropped;
    - `bare-open`: a `(` without a label is dropped;
    - `other-token`: a leaf other than `XX` or the word due there is taken as its leaf;
    - `extra-slots`: slots after the last word are dropped;
    - `missing-words`: words left over at the end become `XX` preterminals at the end of
      the root's last child when that is a bracket (nearly always the `S` over the
      sentence), else at the end of the root;
    - `unclosed`: brackets still open at the end are closed there;
    - `empty-bracket`: brackets over no word are dropped.
    """
    repairs: set[str] = set()
    root = _Node(TOP)
    stack = [root]
    used = 0
    for token in output.split():
        if token.startswith("(") and len(token) > 1:
            node = _Node(token[1:])
            stack[-1].children.append(node)
            stack.append(node)
        elif token.startswith(")"):
            if len(stack) == 1:
                repairs.add("unmatched-close")
            else:
                stack.pop()
        elif token == "(":
            repairs.add("bare-open")
        else:
            if token != PLACEHOLDER_TAG and (used == len(words) or token != words[used]):
                repairs.add("other-token")
            if used == len(words):
                repairs.add("extra-slots")
                continue
            stack[-1].children.append(Tree(PLACEHOLDER_TAG, (words[used],)))
            used += 1
    if len(stack) > 1:
        repairs.add("unclosed")
    if used < len(words):
        repairs.add("missing-words")
        last = root.children[-1] if root.children else None
        home = last if isinstance(last, _Node) else root
        home.children.extend(Tree(PLACEHOLDER_TAG, (w,)) for w in words[used:])
    tree = _freeze(root, repairs) or Tree(TOP, ())
    return Delinearized(tree, tuple(sorted(repairs)))
