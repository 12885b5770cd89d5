"""The paper setups (IWSLT-14, WMT-17, OPUS-100, 102 languages) from raw text to BLEU, above the plugin.

``config`` loads ``configs/<setup>.yaml`` (OmegaConf); ``prepare`` cleans, tokenises, segments and binarises
text with ``deepnet_text.textprep`` (shared with the plugin's translator); ``launch`` builds and runs the
training command; ``evaluate`` averages checkpoints, translates and scores; ``report`` turns records into
tables; ``lang_tags`` names the multilingual tag strategies; ``runner`` is the command builder and log reader
the experiments share.
The shell scripts in ``scripts/`` call these modules.
"""
