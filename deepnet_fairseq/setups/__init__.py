"""The paper setups (IWSLT-14, WMT-17, OPUS-100, 102 languages) from raw text to BLEU.

``config`` loads ``configs/<setup>.yaml``; ``textprep`` cleans, tokenises and segments text;
``prepare`` runs the preparation steps; ``launch`` builds the training command; ``average``
averages checkpoints; ``score`` computes each setup's metric; ``records`` appends run records;
``report`` turns records into tables. The shell scripts in ``scripts/`` call these modules.
"""
