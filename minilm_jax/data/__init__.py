"""Corpora and batch streams, and the files they are read from and written to: corpus loading,
packing and the resumable batch stream (`corpus`), corpora in several languages (`languages`),
prepared corpora (`prepared`), the built-in corpora (`demo_corpus`), WordNet's database reader and
split (`wordnet_db`), the thesis's augmentation (`augment`), word vectors for the LSTM students
(`word_vectors`), and files written whole and digested by their bytes (`files`)."""
