from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("benchapp", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="db_pid",
            field=models.IntegerField(null=True),
        ),
        migrations.AddField(
            model_name="execution",
            name="os_pid",
            field=models.IntegerField(null=True),
        ),
    ]
