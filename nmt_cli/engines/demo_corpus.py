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
from dataclasses import dataclass

DEMO_VERSION = 1
DEMO_SPLITS = {"train": 25_000, "valid": 500, "test": 500}
MIN_WORDS, MAX_WORDS = 5, 20

# --- lexicon -------------------------------------------------------------------------------

# english singular, english plural, german singular, german plural, gender (m/f/n)
NOUNS: list[tuple[str, str, str, str, str]] = [
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("man", "men", "Mann", "Männer", "m"),
    ("bird", "birds", "Vogel", "Vögel", "m"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"),
    ("doctor", "doctors", "Arzt", "Ärzte", "m"),
    ("friend", "friends", "Freund", "Freunde", "m"),
    ("table", "tables", "Tisch", "Tische", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("tree", "trees", "Baum", "Bäume", "m"),
    ("garden", "gardens", "Garten", "Gärten", "m"),
    ("letter", "letters", "Brief", "Briefe", "m"),
    ("brother", "brothers", "Bruder", "Brüder", "m"),
    ("train", "trains", "Zug", "Züge", "m"),
    ("ball", "balls", "Ball", "Bälle", "m"),
    ("king", "kings", "König", "Könige", "m"),
    ("cat", "cats", "Katze", "Katzen", "f"),
    ("woman", "women", "Frau", "Frauen", "f"),
    ("flower", "flowers", "Blume", "Blumen", "f"),
    ("door", "doors", "Tür", "Türen", "f"),
    ("school", "schools", "Schule", "Schulen", "f"),
    ("city", "cities", "Stadt", "Städte", "f"),
    ("mouse", "mice", "Maus", "Mäuse", "f"),
    ("sister", "sisters", "Schwester", "Schwestern", "f"),
    ("mother", "mothers", "Mutter", "Mütter", "f"),
    ("daughter", "daughters", "Tochter", "Töchter", "f"),
    ("bag", "bags", "Tasche", "Taschen", "f"),
    ("street", "streets", "Straße", "Straßen", "f"),
    ("bridge", "bridges", "Brücke", "Brücken", "f"),
    ("newspaper", "newspapers", "Zeitung", "Zeitungen", "f"),
    ("child", "children", "Kind", "Kinder", "n"),
    ("house", "houses", "Haus", "Häuser", "n"),
    ("book", "books", "Buch", "Bücher", "n"),
    ("horse", "horses", "Pferd", "Pferde", "n"),
    ("car", "cars", "Auto", "Autos", "n"),
    ("window", "windows", "Fenster", "Fenster", "n"),
    ("picture", "pictures", "Bild", "Bilder", "n"),
    ("girl", "girls", "Mädchen", "Mädchen", "n"),
    ("boat", "boats", "Boot", "Boote", "n"),
    ("animal", "animals", "Tier", "Tiere", "n"),
    ("knife", "knives", "Messer", "Messer", "n"),
]

ADJECTIVES: list[tuple[str, str]] = [
    ("big", "groß"),
    ("small", "klein"),
    ("old", "alt"),
    ("young", "jung"),
    ("new", "neu"),
    ("red", "rot"),
    ("green", "grün"),
    ("black", "schwarz"),
    ("white", "weiß"),
    ("happy", "glücklich"),
    ("tired", "müde"),
    ("beautiful", "schön"),
    ("fast", "schnell"),
    ("strong", "stark"),
    ("cold", "kalt"),
    ("poor", "arm"),
    ("friendly", "freundlich"),
    ("hungry", "hungrig"),
]


@dataclass(frozen=True)
class Verb:
    en_base: str
    en_3sg: str
    en_participle: str  # may carry a particle: "called up"
    de_1sg: str
    de_3sg: str
    de_pl: str
    de_participle: str
    particle: str = ""  # German separable prefix, moved to the clause end in main clauses


TRANSITIVE = [
    Verb("see", "sees", "seen", "sehe", "sieht", "sehen", "gesehen"),
    Verb("find", "finds", "found", "finde", "findet", "finden", "gefunden"),
    Verb("buy", "buys", "bought", "kaufe", "kauft", "kaufen", "gekauft"),
    Verb("read", "reads", "read", "lese", "liest", "lesen", "gelesen"),
    Verb("carry", "carries", "carried", "trage", "trägt", "tragen", "getragen"),
    Verb("love", "loves", "loved", "liebe", "liebt", "lieben", "geliebt"),
    Verb("need", "needs", "needed", "brauche", "braucht", "brauchen", "gebraucht"),
    Verb("paint", "paints", "painted", "male", "malt", "malen", "gemalt"),
    Verb("visit", "visits", "visited", "besuche", "besucht", "besuchen", "besucht"),
    Verb("hold", "holds", "held", "halte", "hält", "halten", "gehalten"),
    Verb("wash", "washes", "washed", "wasche", "wäscht", "waschen", "gewaschen"),
    Verb("know", "knows", "known", "kenne", "kennt", "kennen", "gekannt"),
    Verb("hear", "hears", "heard", "höre", "hört", "hören", "gehört"),
    Verb("take", "takes", "taken", "nehme", "nimmt", "nehmen", "genommen"),
    Verb("open", "opens", "opened", "öffne", "öffnet", "öffnen", "geöffnet"),
    Verb("build", "builds", "built", "baue", "baut", "bauen", "gebaut"),
    Verb("catch", "catches", "caught", "fange", "fängt", "fangen", "gefangen"),
    Verb("sell", "sells", "sold", "verkaufe", "verkauft", "verkaufen", "verkauft"),
    Verb("call up", "calls up", "called up", "rufe", "ruft", "rufen", "angerufen", "an"),
    Verb("pick up", "picks up", "picked up", "hole", "holt", "holen", "abgeholt", "ab"),
    Verb("invite", "invites", "invited", "lade", "lädt", "laden", "eingeladen", "ein"),
    Verb(
        "bring along", "brings along", "brought along", "bringe", "bringt", "bringen",
        "mitgebracht", "mit",
    ),
    Verb("look at", "looks at", "looked at", "schaue", "schaut", "schauen", "angeschaut", "an"),
]  # fmt: skip

INTRANSITIVE = [
    Verb("sleep", "sleeps", "slept", "schlafe", "schläft", "schlafen", "geschlafen"),
    Verb("laugh", "laughs", "laughed", "lache", "lacht", "lachen", "gelacht"),
    Verb("sing", "sings", "sung", "singe", "singt", "singen", "gesungen"),
    Verb("wait", "waits", "waited", "warte", "wartet", "warten", "gewartet"),
    Verb("work", "works", "worked", "arbeite", "arbeitet", "arbeiten", "gearbeitet"),
    Verb("play", "plays", "played", "spiele", "spielt", "spielen", "gespielt"),
    Verb("dance", "dances", "danced", "tanze", "tanzt", "tanzen", "getanzt"),
    Verb("cry", "cries", "cried", "weine", "weint", "weinen", "geweint"),
]

# verbs that take a "that" clause; "know" becomes wissen here, kennen with an object
SAY_VERBS = [
    Verb("say", "says", "said", "sage", "sagt", "sagen", "gesagt"),
    Verb("know", "knows", "known", "weiß", "weiß", "wissen", "gewusst"),
    Verb("think", "thinks", "thought", "denke", "denkt", "denken", "gedacht"),
    Verb("hope", "hopes", "hoped", "hoffe", "hofft", "hoffen", "gehofft"),
]

HAVE = Verb("have", "has", "had", "habe", "hat", "haben", "gehabt")

# english pronoun, german pronoun, person: "1sg" | "3sg" | "pl"
PRONOUNS = [
    ("I", "ich", "1sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "pl"),
    ("they", "sie", "pl"),
]

ADVERBS = [("today", "heute"), ("tomorrow", "morgen"), ("now", "jetzt"), ("then", "dann")]
ADVERBS += [("sometimes", "manchmal"), ("here", "hier")]
PREPOSITIONS = [("with", "mit"), ("from", "von"), ("to", "zu"), ("near", "bei")]
CONTRACTIONS = {("zu", "dem"): "zum", ("zu", "der"): "zur", ("von", "dem"): "vom"}
CONTRACTIONS[("bei", "dem")] = "beim"
CONJUNCTIONS = [("because", "weil"), ("although", "obwohl"), ("when", "wenn")]

_UNITS_EN = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_UNITS_DE = ["", "ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
_TEENS_EN = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen"]
_TEENS_EN += ["seventeen", "eighteen", "nineteen"]
_TEENS_DE = ["zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn"]
_TEENS_DE += ["siebzehn", "achtzehn", "neunzehn"]
_TENS_EN = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_TENS_DE = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig"]
_TENS_DE += ["neunzig"]


def number_words(n: int) -> tuple[str, str]:
    """2..99 as (English, German) words: 'twenty-one' / 'einundzwanzig'."""
    if not 2 <= n <= 99:
        raise ValueError(f"numbers run from 2 to 99, got {n}")
    if n < 10:
        return _UNITS_EN[n], _UNITS_DE[n]
    if n < 20:
        return _TEENS_EN[n - 10], _TEENS_DE[n - 10]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return _TENS_EN[tens], _TENS_DE[tens]
    return f"{_TENS_EN[tens]}-{_UNITS_EN[unit]}", f"{_UNITS_DE[unit]}und{_TENS_DE[tens]}"


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


def demo_corpus(seed: int = 1) -> dict[str, list[tuple[str, str]]]:
    """The whole demo corpus in memory (26,000 short pairs, a few MB)."""
    seen: set[str] = set()
    index = 0
    out: dict[str, list[tuple[str, str]]] = {}
    # held-out splits first, so that train excludes them and not the other way round
    for name in ("valid", "test", "train"):
        pairs: list[tuple[str, str]] = []
        while len(pairs) < DEMO_SPLITS[name]:
            src, tgt = generate_pair(seed, index)
            index += 1
            if src in seen:
                continue
            seen.add(src)
            pairs.append((src, tgt))
        out[name] = pairs
    return {name: out[name] for name in DEMO_SPLITS}
