"""The experiment drivers (demo, sweeps, stability map, figures, studies): above the setups and the plugin,
starting fairseq through deepnet_setups.runner."""
