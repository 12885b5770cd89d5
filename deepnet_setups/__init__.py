"""The paper setups (IWSLT-14, WMT-17, OPUS-100, 102 languages) from raw text to BLEU.

``config`` loads ``configs/<setup>.yaml``; ``prepare`` cleans, tokenises and segments text with
``deepnet_fairseq.textprep`` (one level up: export and translate use it too) and binarises it;
``launch`` builds the training command; ``average`` averages checkpoints; ``score`` computes each
setup's metric; ``records`` appends run records; ``report`` turns records into tables. The shell scripts in ``scripts/`` call these modules.
"""
