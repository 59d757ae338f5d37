"""A stage-2 adapter defined outside `wide` (peft's LoHa), picked by class path: ``adapter: tests.io.plugin_adapter.LoHa``."""

from wide.io import Adapter, register_adapter
from wide.io.adapters import recorded_settings


@register_adapter("test-loha")
class LoHa(Adapter):
    marker = "hada_"

    def peft_config(self, settings):
        from peft import LoHaConfig

        return LoHaConfig(r=settings["r"], alpha=settings["alpha"], target_modules=settings["targets"])

    def read(self, shapes, extra, where, **overrides):
        if not any(self.marker in k for k in shapes):
            return None
        return recorded_settings(extra, self.registered_name, where)


class NotAnAdapter:
    pass
