from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0002_servedmodel_batch_invariant'),
    ]

    operations = [
        migrations.AddField(
            model_name='servedmodel',
            name='chat_template',
            field=models.TextField(blank=True, default='', help_text="A Jinja chat template that replaces the model's own (`manage.py model_add --chat-template FILE`); blank: the template in the model's files, and a model without one serves /v1/completions only."),
        ),
        migrations.AddField(
            model_name='servedmodel',
            name='dtype',
            field=models.CharField(blank=True, choices=[('float32', 'float32'), ('bfloat16', 'bfloat16'), ('float16', 'float16')], default='', help_text="The dtype workers load this model in when not told otherwise (blank: ENGINE_DTYPE, else the engine's default). Applies when a worker (re)starts.", max_length=16),
        ),
    ]
