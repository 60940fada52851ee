"""The papers' published figures the tests check lit-embed's against."""

from __future__ import annotations

#: HashFormers Table 2: #Total, #Emb, PCR (All), PCR (Emb), PoEP of each experiment, against BERT-MLM.
TABLE_2 = {
    "bert_mlm": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "bert_sr": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "md5_emb50k": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "md5_emb1k": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "md5_pool": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "md5_add": ("86.2M", "197.4K", 30.8, 99.5, 0.2),
    "md5_proj": ("86.1M", "99.1K", 30.9, 99.7, 0.1),
    "lsh_emb50k": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "lsh_emb1k": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "lsh_pool": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "lsh_add": ("86.2M", "197.4K", 30.8, 99.5, 0.2),
    "lsh_proj": ("86.1M", "99.1K", 30.9, 99.7, 0.1),
    "proformer": ("15.1M", "322.6K", 87.9, 99.2, 2.1),  # 2 layers, trained on the task; baseline BERT-MLM's
    "canine_c": ("121.0M", "12.3M", 2.9, 68.1, 10.2),  # google/canine-c is 132.1M / 12.6M: see CANINE_C_COUNTED
}


#: What google/canine-c's architecture counts (its config.json: 8 hash tables of 16,384 x 96, 16,384 character
#: positions) where Table 2 prints 121.0M / 12.3M (16,000 x 768): the one Table 2 row lit-embed does not match.
CANINE_C_COUNTED = ("132.1M", "12.6M")


#: HashFormers Table 6 (Appendix C): the models it pre-trains on BPE pieces as well as on words; each is the
#: experiment ``<name>_subword``, with the counts of ``<name>``'s Table 2 row.
TABLE_6_SUBWORD = ("md5_emb50k", "md5_proj", "lsh_emb50k", "lsh_proj")
