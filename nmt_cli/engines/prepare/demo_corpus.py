"""The built-in demo corpus: a generated English-to-German-like language pair.

The quickstart must train to a convincing BLEU on a laptop CPU in minutes, so the pair is
small (a few hundred words a side) but not trivial: the model has to learn noun gender and
case agreement of articles and adjectives (der/den/dem, ein/einen/einem, grosse/grossen),
plural forms and the dative plural -n, contractions (zu dem -> zum), verb-second order after
a fronted adverb or clause, verb-final subordinate clauses, split separable verbs
(ruft ... an / anruft), the perfect with its participle at the end, negation with
"nicht" or "kein", and numbers written as words. Every German sentence is a deterministic
function of the English one, so nothing the model cannot see in the source decides the
target, and a generated pair is a pure function of (seed, index): the corpus is identical
on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from nmt_cli.engines.prepare.demo_lexicon import (
    ADJECTIVES,
    ADVERBS,
    CONJUNCTIONS,
    CONTRACTIONS,
    HAVE,
    INTRANSITIVE,
    NOUNS,
    PREPOSITIONS,
    PRONOUNS,
    SAY_VERBS,
    TRANSITIVE,
    Verb,
    number_words,
)

DEMO_VERSION = 1
DEMO_SPLITS = {"train": 25_000, "valid": 500, "test": 500}
MIN_WORDS, MAX_WORDS = 5, 20

# --- German morphology ---------------------------------------------------------------------

_DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
_INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
    "dat": {"m": "einem", "f": "einer", "n": "einem"},
}
# adjective endings after a definite article (weak), an indefinite one (mixed), or none
_WEAK = {"nom": {"m": "e", "f": "e", "n": "e"}, "acc": {"m": "en", "f": "e", "n": "e"}}
_WEAK["dat"] = {"m": "en", "f": "en", "n": "en"}
_MIXED = {"nom": {"m": "er", "f": "e", "n": "es"}, "acc": {"m": "en", "f": "e", "n": "es"}}
_MIXED["dat"] = {"m": "en", "f": "en", "n": "en"}


def _inflect_adjective(adjective: str, ending: str) -> str:
    stem = adjective[:-1] if adjective.endswith("e") else adjective
    return stem + ending


@dataclass(frozen=True)
class NounPhrase:
    """An English noun phrase and what German needs to render it in any case."""

    noun: int  # index into NOUNS
    determiner: str  # "the" | "a" | "number"
    adjective: int | None
    count: int = 1  # > 1 only with determiner "number" or plural "the"

    @property
    def plural(self) -> bool:
        return self.count > 1

    def english(self) -> list[str]:
        en_sg, en_pl, *_ = NOUNS[self.noun]
        words: list[str] = []
        if self.determiner == "the":
            words.append("the")
        elif self.determiner == "a":
            words.append("an" if (self._first_en_word()[0] in "aeiou") else "a")
        else:
            words.append(number_words(self.count)[0])
        if self.adjective is not None:
            words.append(ADJECTIVES[self.adjective][0])
        words.append(en_pl if self.plural else en_sg)
        return words

    def _first_en_word(self) -> str:
        if self.adjective is not None:
            return ADJECTIVES[self.adjective][0]
        return NOUNS[self.noun][0]

    def german(self, case: str, negated: bool = False) -> list[str]:
        _, _, de_sg, de_pl, gender = NOUNS[self.noun]
        words: list[str] = []
        adjective = ADJECTIVES[self.adjective][1] if self.adjective is not None else None
        if self.plural:
            noun = de_pl
            if case == "dat" and not noun.endswith(("n", "s")):
                noun += "n"
            if self.determiner == "the":
                words.append(_DEFINITE[case]["pl"])
                ending = "en"
            else:
                words.append(number_words(self.count)[1])
                ending = "en" if case == "dat" else "e"
        else:
            noun = de_sg
            if self.determiner == "the":
                words.append(_DEFINITE[case][gender])
                ending = _WEAK[case][gender]
            else:
                article = _INDEFINITE[case][gender]
                words.append("k" + article if negated else article)
                ending = _MIXED[case][gender]
        if adjective is not None:
            words.append(_inflect_adjective(adjective, ending))
        words.append(noun)
        return words


@dataclass(frozen=True)
class Subject:
    pronoun: int | None  # index into PRONOUNS, or None for a noun phrase
    phrase: NounPhrase | None

    @property
    def person(self) -> str:
        if self.pronoun is not None:
            return PRONOUNS[self.pronoun][2]
        assert self.phrase is not None
        return "pl" if self.phrase.plural else "3sg"

    def english(self) -> list[str]:
        if self.pronoun is not None:
            return [PRONOUNS[self.pronoun][0]]
        assert self.phrase is not None
        return self.phrase.english()

    def german(self) -> list[str]:
        if self.pronoun is not None:
            return [PRONOUNS[self.pronoun][1]]
        assert self.phrase is not None
        return self.phrase.german("nom")


def _en_verb(verb: Verb, person: str) -> str:
    return verb.en_3sg if person == "3sg" else verb.en_base


def _de_verb(verb: Verb, person: str) -> str:
    return {"1sg": verb.de_1sg, "3sg": verb.de_3sg, "pl": verb.de_pl}[person]


@dataclass(frozen=True)
class Clause:
    """subject + verb (+ object) (+ prepositional phrase), in one of three verb forms."""

    subject: Subject
    verb: Verb
    obj: NounPhrase | None
    pp: tuple[int, NounPhrase] | None  # (index into PREPOSITIONS, phrase in the dative)
    form: str  # "present" | "perfect" | "negated"

    def english(self) -> list[str]:
        person = self.subject.person
        words = self.subject.english()
        if self.form == "perfect":
            words += [_en_verb(HAVE, person), *self.verb.en_participle.split()]
        elif self.form == "negated":
            words += ["does" if person == "3sg" else "do", "not", *self.verb.en_base.split()]
        else:
            words += _en_verb(self.verb, person).split()
        if self.obj is not None:
            words += self.obj.english()
        if self.pp is not None:
            words += [PREPOSITIONS[self.pp[0]][0], *self.pp[1].english()]
        return words

    def _middle(self) -> tuple[list[str], bool]:
        """Object, prepositional phrase and negation: the German middle field.

        Returns the words and whether a "kein" article already carries the negation.
        """
        words: list[str] = []
        kein = False
        if self.obj is not None:
            kein = self.form == "negated" and self.obj.determiner == "a"
            words += self.obj.german("acc", negated=kein)
        if self.pp is not None:
            preposition = PREPOSITIONS[self.pp[0]][1]
            phrase = self.pp[1].german("dat")
            contracted = CONTRACTIONS.get((preposition, phrase[0]))
            if contracted and self.pp[1].determiner == "the":
                words += [contracted, *phrase[1:]]
            else:
                words += [preposition, *phrase]
        if self.form == "negated" and not kein:
            words.append("nicht")
        return words, kein

    def german_main(self, fronted: list[str] | None = None) -> list[str]:
        """Verb second: after a fronted element the subject follows the finite verb."""
        person = self.subject.person
        middle, _ = self._middle()
        finite_verb = HAVE if self.form == "perfect" else self.verb
        finite = _de_verb(finite_verb, person)
        if self.form == "perfect":
            tail = [self.verb.de_participle]
        else:
            tail = [self.verb.particle] if self.verb.particle else []
        if fronted:
            return [*fronted, finite, *self.subject.german(), *middle, *tail]
        return [*self.subject.german(), finite, *middle, *tail]

    def german_subordinate(self) -> list[str]:
        """Verb final: the separable particle rejoins its verb (anruft, angerufen hat)."""
        person = self.subject.person
        middle, _ = self._middle()
        if self.form == "perfect":
            verbs = [self.verb.de_participle, _de_verb(HAVE, person)]
        else:
            verbs = [self.verb.particle + _de_verb(self.verb, person)]
        return [*self.subject.german(), *middle, *verbs]


# --- sentence generation -------------------------------------------------------------------


class _Generator:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def noun_phrase(self, allow_number: bool = True) -> NounPhrase:
        rng = self.rng
        noun = rng.randrange(len(NOUNS))
        adjective = rng.randrange(len(ADJECTIVES)) if rng.random() < 0.4 else None
        roll = rng.random()
        if allow_number and roll < 0.15:
            count = rng.randrange(2, 13) if rng.random() < 0.7 else rng.randrange(13, 100)
            return NounPhrase(noun, "number", adjective, count)
        if roll < 0.30:
            return NounPhrase(noun, "the", adjective, 2)
        if roll < 0.70:
            return NounPhrase(noun, "the", adjective)
        return NounPhrase(noun, "a", adjective)

    def subject(self) -> Subject:
        if self.rng.random() < 0.3:
            return Subject(self.rng.randrange(len(PRONOUNS)), None)
        return Subject(None, self.noun_phrase())

    def clause(self) -> Clause:
        rng = self.rng
        form = rng.choices(["present", "perfect", "negated"], weights=[5, 3, 2])[0]
        if rng.random() < 0.25:
            verb, obj = rng.choice(INTRANSITIVE), None
        else:
            verb = rng.choice(TRANSITIVE)
            # "nicht" with a counted object reads badly: negate only the/a objects
            obj = self.noun_phrase(allow_number=form != "negated")
        pp = None
        if form != "negated" and rng.random() < 0.35:
            pp = (rng.randrange(len(PREPOSITIONS)), self.noun_phrase())
        return Clause(self.subject(), verb, obj, pp, form)

    def sentence(self) -> tuple[list[str], list[str]]:
        rng = self.rng
        kind = rng.choices(["plain", "adverb", "that", "conj", "conj_first"], [4, 2, 2, 2, 1])[0]
        if kind == "plain":
            c = self.clause()
            return c.english(), c.german_main()
        if kind == "adverb":
            en_adv, de_adv = rng.choice(ADVERBS)
            c = self.clause()
            return [en_adv, *c.english()], c.german_main(fronted=[de_adv])
        if kind == "that":
            speaker = self.subject()
            verb = rng.choice(SAY_VERBS)
            c = self.clause()
            en = [*speaker.english(), _en_verb(verb, speaker.person), "that", *c.english()]
            de_speaker = [*speaker.german(), _de_verb(verb, speaker.person) + ",", "dass"]
            return en, de_speaker + c.german_subordinate()
        en_conj, de_conj = rng.choice(CONJUNCTIONS)
        main, sub = self.clause(), self.clause()
        if kind == "conj":
            main_de = main.german_main()
            main_de[-1] += ","
            return [*main.english(), en_conj, *sub.english()], [
                *main_de,
                de_conj,
                *sub.german_subordinate(),
            ]
        # a fronted subordinate clause takes the first position: the main verb comes next
        sub_en = sub.english()
        sub_en[-1] += ","
        sub_de = sub.german_subordinate()
        sub_de[-1] += ","
        return [en_conj, *sub_en, *main.english()], main.german_main(fronted=[de_conj, *sub_de])


def _finish(words: list[str]) -> str:
    text = " ".join(words) + "."
    return text[0].upper() + text[1:]


def generate_pair(seed: int, index: int) -> tuple[str, str]:
    """The pair at `index` of the stream for `seed`: a pure function of both."""
    rng = random.Random(f"nmt-demo-{DEMO_VERSION}-{seed}-{index}")
    gen = _Generator(rng)
    while True:
        en, de = gen.sentence()
        if MIN_WORDS <= len(en) <= MAX_WORDS:
            return _finish(en), _finish(de)


class DemoStream:
    """The demo corpus of `seed`: its held-out splits made at once (1,000 pairs), its
    training pairs made as they are read, so a preparation that keeps the first N
    (`data.max_pairs`) does not make all 25,000. Every `train()` starts over and gives
    the same pairs in the same order, those of `demo_corpus`."""

    def __init__(self, seed: int = 1) -> None:
        self.seed = seed
        self._seen: set[str] = set()
        self._index = 0
        # held-out splits first, so that train excludes them and not the other way round
        self.held_out = {name: self._take(DEMO_SPLITS[name]) for name in ("valid", "test")}

    def _take(self, count: int) -> list[tuple[str, str]]:
        pairs = self._new_pairs(self._seen, self._index)
        out = []
        for _ in range(count):
            self._index, pair = next(pairs)
            out.append(pair)
        return out

    def _new_pairs(self, seen: set[str], index: int) -> Iterator[tuple[int, tuple[str, str]]]:
        """(the index after it, pair) for each new pair from `index` on, skipping sources
        in `seen` (which it extends)."""
        while True:
            pair = generate_pair(self.seed, index)
            index += 1
            if pair[0] not in seen:
                seen.add(pair[0])
                yield index, pair

    def train(self) -> Iterator[tuple[str, str]]:
        pairs = self._new_pairs(set(self._seen), self._index)
        for _ in range(DEMO_SPLITS["train"]):
            yield next(pairs)[1]


def demo_corpus(seed: int = 1) -> dict[str, list[tuple[str, str]]]:
    """The whole demo corpus in memory (26,000 short pairs, a few MB)."""
    stream = DemoStream(seed)
    out = {**stream.held_out, "train": list(stream.train())}
    return {name: out[name] for name in DEMO_SPLITS}
