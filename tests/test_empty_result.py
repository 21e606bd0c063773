"""A corpus whose text holds no usable word (only punctuation) ends with one line naming its sources,
at the first stage whose result would be empty; what was published before it is a valid, documented
artifact (docs/reliability.md, "Empty results"), and nothing of the failing stage is."""

import pytest
from lexiflow.loaders import load
from lexiflow.models.errors import InputError
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, VocabularyParams
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from tests.stages import publish

PUNCTUATION = ["!!! ... ???", "-- ; : ,", "(( )) [[ ]]", '"" !! ?']


@pytest.fixture
def punctuation(tmp_path):
    path = tmp_path / "punct\nuation.txt"  # a name that would break the line if it were not quoted
    path.write_text("\n".join(PUNCTUATION * 50))
    return path


def test_a_corpus_of_punctuation_ends_with_one_line_naming_it_and_publishes_only_valid_artifacts(tmp_path, punctuation):
    store = ArtifactStore(tmp_path / "store")
    corpus = publish(store, ingest_corpus, params=CorpusParams(sources=[str(punctuation)]))
    words = publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=5))
    tokens = publish(store, encode_corpus, corpus=corpus, tokenizer=words)
    with pytest.raises(InputError) as info:
        publish(store, count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams())
    message = str(info.value)
    assert message.startswith(f"no two words co-occur in the train split of {str(punctuation)!r} (")
    assert message.isprintable() and "lower vocabulary.min_count" in message
    catalog = Catalog(store)
    assert sorted(catalog.kinds()) == ["corpus", "tokenized_corpus", "tokenizer"]  # no co-occurrence
    assert catalog.audit(full=True) == (3, []) and store.leftovers() == []
    assert load(catalog, "corpus")["text"].to_list() == PUNCTUATION  # deduplicated, as documented
    assert catalog.latest("corpus")["metrics"]["tokens"] == 14


def test_no_word_over_the_minimum_count_publishes_no_tokenizer(tmp_path, punctuation):
    store = ArtifactStore(tmp_path / "store")
    corpus = publish(store, ingest_corpus, params=CorpusParams(sources=[str(punctuation)]))
    with pytest.raises(InputError) as info:
        publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=50))
    assert str(info.value).startswith(f"no word occurs 50 times or more (vocabulary.min_count) in the train split "
                                      f"of {str(punctuation)!r} (")
    assert Catalog(store).kinds() == ["corpus"] and store.leftovers() == []
