"""Hidden Markov model part-of-speech tagger: supervised maximum likelihood, TnT-style smoothing.

The model (Jurafsky & Martin, SLP3 ch. 8 / appendix A; Brants 2000, "TnT - a statistical
part-of-speech tagger", ANLP):

- states are tags, observations are words, with a dummy boundary state `<s>` before the first word
  and `</s>` after the last;
- as taught (order=2): initial pi(s) = P(s | <s>) = Count(<s>, s) / #sentences, transitions
  P(s_i | s_{i-1}) = Count(s_{i-1}, s_i) / Count(s_{i-1}), emissions P(o | s) = Count(s, o) / Count(s);
  these raw maximum-likelihood tables are `initial_probs()`, `transition_probs()`, `emission_probs()`;
- for decoding, transitions are smoothed by linear interpolation with weights found by deleted
  interpolation (TnT): P(t3 | t1, t2) = l1 P^(t3) + l2 P^(t3 | t2) + l3 P^(t3 | t1, t2) (order=3 is the
  trigram model whose Viterbi runs over state pairs);
- unknown words: TnT's suffix distributions with successive abstraction,
  P(t | l_{n-i+1..n}) = (P^(t | l_{n-i+1..n}) + theta P(t | l_{n-i+2..n})) / (1 + theta), one model for
  capitalised and one for other words, combined log-linearly with a discriminative P(t | word
  features) (multinomial logistic regression on suffixes, prefixes, word shape, capitalisation,
  digits, hyphens, the tags the lowercased form or the last hyphen part has as a known word), fit
  on the rare words of train. Both are turned into an emission score, P(w | t) ∝ P(t | w) / P(t)^kappa
  (Bayes' rule at kappa = 1; kappa calibrated, the prior scaling of hybrid HMM/classifier models), mixed
  with the pooled emissions of the word's known other casings (`mexico` -> `Mexico`) when there are any;
  the mixing weights, kappa and the emission weights are calibrated on dev;
- state splits (supervised, so still plain MLE): `(word, tag, refinement)` training items make the states
  `tag|refinement` (UPOS split by XPOS, ...), and the `lexicalize` most frequent ambiguous words get
  word-specific states `tag|word` (Pla & Molina 2004, "Improving part-of-speech tagging using
  lexicalized HMMs"); `tag` maps states back to tags;
- words seen at most `rare_max_count` times mix their counted emission with the unknown-word model
  (a seen-once word has usually shown only one of its tags); a capitalised sentence-initial word
  unseen in that form uses the emissions of its lowercased form when that one is known.
The package reads top to bottom:

- `counts`: states, tag n-gram and (word, tag) counts, deleted interpolation, the transition table;
- `calibration`: the calibration values (`Calibration`, a frozen dataclass), their ranges and dev grids;
- `unknown`: the unknown-word models (suffix tables, logistic regression, emission scores);
- `decoding`: greedy, Viterbi (batched and ragged) and beam search as pure functions of the tables;
- `persistence`: Parquet tables plus a JSON config (counts and coefficients; `load` rebuilds the
  decoding tables with the same code as `fit`, so a round trip is exact);
- `tagger`: `HMMTagger`, which fits, calibrates on dev and tags with the above.
"""

from lexiflow.models.hmm.calibration import Calibration
from lexiflow.models.hmm.tagger import HMMTagger
from lexiflow.models.hmm.unknown import case_class, word_shape

__all__ = ["Calibration", "HMMTagger", "case_class", "word_shape"]
