"""The papers' published figures the tests check lit-embed's against."""

from __future__ import annotations

#: HashFormers Table 2: #Total, #Emb, PCR (All), PCR (Emb), PoEP of each experiment, against BERT-MLM.
TABLE_2 = {
    "bert_mlm": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "bert_sr": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "md5_emb50k": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "md5_emb1k": ("86.8M", "797.2K", 30.3, 97.9, 1.0),  # Pool's figures: see EMB_1K_COUNTED
    "md5_pool": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "md5_add": ("86.2M", "197.4K", 30.8, 99.5, 0.2),
    "md5_proj": ("86.1M", "99.1K", 30.9, 99.7, 0.1),
    "lsh_emb50k": ("124.6M", "38.6M", 0.0, 0.0, 31.0),
    "lsh_emb1k": ("86.8M", "797.2K", 30.3, 97.9, 1.0),  # Pool's figures: see EMB_1K_COUNTED
    "lsh_pool": ("86.8M", "797.2K", 30.3, 97.9, 1.0),
    "lsh_add": ("86.2M", "197.4K", 30.8, 99.5, 0.2),
    "lsh_proj": ("86.1M", "99.1K", 30.9, 99.7, 0.1),
    "proformer": ("15.1M", "322.6K", 87.9, 99.2, 2.1),  # 2 layers, trained on the task; baseline BERT-MLM's
    "canine_c": ("121.0M", "12.3M", 2.9, 68.1, 10.2),  # CANINE's README's "121M": see CANINE_C_COUNTED
}


#: Emb (1K) with the text's N = 1000 rows (eq. 12: N x d = 768.0K), where Table 2 repeats Pool's row (797.2K is
#: Pool's 13 + 1025 rows x 768) as its Emb (1K) counts: a misprint.
EMB_1K_COUNTED = ("86.8M", "768.0K")

#: CANINE-C as its authors count it (132,082,944 in google/canine-c's modules less the 14,336 x 768 position rows
#: never trained) and its embedding as HashFormers' eq. 10 (16,000 x 768): 121,072,896 and 12,288,000, where Table 2
#: prints CANINE's README's "121M" as 121.0M. The tables and position rows the modules hold: 132.1M / 12.6M.
CANINE_C_COUNTED = ("121.1M", "12.3M")
CANINE_C_MODULES = ("132.1M", "12.6M")

#: k-sub-embedding Table 7: millions of tokens of each XNLI language in the paper's CommonCrawl extract (3,985M).
TABLE_7 = {"ar": 181, "bg": 193, "de": 338, "el": 170, "en": 802, "es": 273, "fr": 315, "hi": 91, "ru": 426, "sw": 232,
           "th": 125, "tr": 178, "ur": 101, "vi": 323, "zh": 237}


#: HashFormers Table 6 (Appendix C): the models it pre-trains on BPE pieces as well as on words; each is the
#: experiment ``<name>_subword``, with the counts of ``<name>``'s Table 2 row.
TABLE_6_SUBWORD = ("md5_emb50k", "md5_proj", "lsh_emb50k", "lsh_proj")
