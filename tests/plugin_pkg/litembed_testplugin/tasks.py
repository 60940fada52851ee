"""A task: the shipped sample topics under a name of the plugin's."""

from __future__ import annotations

import dataclasses

from lit_embed.data.tasks import TASKS

SAMPLE_TOPICS = dataclasses.replace(TASKS["topics"], name="sample_topics", header="SAMPLE", source="litembed-testplugin")
