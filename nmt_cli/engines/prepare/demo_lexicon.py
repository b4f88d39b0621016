"""The demo corpus's words: both languages' forms of each word, and numbers as words.

Every generated pair is drawn from these tables by index, so any edit here changes the
corpus: bump `DEMO_VERSION` in demo_corpus.py with it, or two machines holding different
versions would train on different data under one name.
"""

from __future__ import annotations

from dataclasses import dataclass

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
