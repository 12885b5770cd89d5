"""deepnet_text: the text pipeline (``textprep``) that the plugin's deploy path and the setups share.

Outside the plugin package on purpose: importing ``deepnet_fairseq`` registers its models with fairseq, which
imports fairseq (seconds of start-up), and preparing text needs none of it.
"""
