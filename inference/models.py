from django.db import models
from django.utils import timezone


class ServedModel(models.Model):
    """Registry row for a model the platform serves.

    Built-in names (inference.engine.registry) resolve without the database;
    rows here add models and let operators disable or re-point them.
    """

    name = models.CharField(max_length=100, unique=True)
    source = models.CharField(max_length=500, help_text="gguf:<path>, pypi:<dist>/<file> or a safetensors directory")
    context_length = models.PositiveIntegerField(default=8192)
    enabled = models.BooleanField(default=True)
    owned_by = models.CharField(max_length=60, default="platform")
    batch_invariant = models.BooleanField(
        null=True, default=None,
        help_text="Workers serve this model in batch-invariant mode: a seeded request gives the same tokens whatever "
                  "else runs beside it. Unknown (the default): on where it costs little (a bf16 Q4 model on a CPU "
                  "without 16-bit GEMM hardware), off elsewhere (CUDA, CPUs with bf16 GEMM: BENCHMARKS.md). Applies "
                  "when a worker (re)starts; responses' system_fingerprint changes with it.")
    chat_template = models.TextField(
        blank=True, default="",
        help_text="A Jinja chat template that replaces the model's own (`manage.py model_add --chat-template FILE`); "
                  "blank: the template in the model's files, and a model without one serves /v1/completions only.")
    dtype = models.CharField(
        max_length=16, blank=True, default="", choices=[("float32", "float32"), ("bfloat16", "bfloat16"),
                                                        ("float16", "float16")],
        help_text="The dtype workers load this model in when not told otherwise (blank: ENGINE_DTYPE, else the "
                  "engine's default). Applies when a worker (re)starts.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def created_unix(self) -> int:
        return int(self.created_at.timestamp())
