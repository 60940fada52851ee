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
}
