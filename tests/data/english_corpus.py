"""Generated English-like documents for the curation tests: common words in simple sentences.

The words are real English (so the fastText language filter says English) and random (so the Gopher
repetition rules and the dedups see distinct documents unless a test plants a copy).
"""

from __future__ import annotations

import random

WORDS = """
account action activity address advice afternoon agreement airport amount animal answer apartment
apple area argument army arrival article artist attention audience author average baby background
balance bank basket battle beach bedroom behavior bicycle bird birthday blanket board boat body book
border bottle bottom branch bread breakfast bridge brother budget building business butter button
cabinet camera campaign candle capital captain career carpet castle category ceiling center century
chair chance chapter character chicken child church circle city class climate clock cloud coast coffee
college colour comfort committee community company computer concert condition contract conversation
corner cottage country county courage cousin culture customer damage danger daughter debate decision
degree delivery desert design detail dinner direction director disease distance doctor dream driver
economy editor effect effort election energy engine evening event example exercise experience factory
family farmer father feature festival field figure finger flight flower forest fortune freedom friend
garden gate government grandfather grass group guest guitar habit harbor harvest health hearing heart
history holiday horse hospital hotel house husband idea image income industry insect instance island
journey judge kitchen knowledge ladder lake language lawyer leader lesson letter library light location
machine magazine manager market meadow meeting member memory message method middle minute mirror
moment money month morning mother mountain movie museum music nation nature neighbor newspaper night
north notice number ocean office officer opinion orange order owner painting paper parent party
passenger pattern payment people pepper person picture piece planet player pocket poem police policy
population position potato power practice present president pressure problem process product program
project promise property purpose quality question radio reason recipe record region river road rock
roof room safety salad sample school science season secret sector security sentence shadow shape
sister situation skill society soldier solution song sound source space speaker speech spring square
station story stranger street student studio subject success summer surface system table teacher
temperature theory thought ticket tower town tradition traffic train travel treasure valley vegetable
village visitor voice volume wall weather wedding week window winter woman worker writer yard
builds carries changes chooses collects covers creates describes discovers enjoys explains follows
gathers guides helps improves includes joins keeps leaves measures moves notices offers opens paints
plans prepares protects reaches reads remembers repairs returns shares shows studies supports teaches
touches visits watches writes
ancient bright careful cheerful clever common curious early famous fresh gentle golden happy honest
large little lovely modern narrow patient perfect quiet rapid simple silent smooth strong sudden
sweet tall warm wide young
""".split()  # noqa: SIM905 - a word list reads best as text


def sentence(rng: random.Random) -> str:
    w = lambda: rng.choice(WORDS)  # noqa: E731
    return f"The {w()} {w()} of the {w()} {w()} and {w()} to the {w()} {w()} {w()} with {w()}."


def prose(rng: random.Random, sentences: int = 12, per_line: int = 3) -> str:
    """Lines of ``per_line`` sentences: passes the Gopher, C4 and FineWeb filters and reads as English."""
    made = [sentence(rng) for _ in range(sentences)]
    return "\n".join(" ".join(made[i : i + per_line]) for i in range(0, sentences, per_line))


def random_words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]
