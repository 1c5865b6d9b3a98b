"""Least privilege in the SAM template, checked on what SAM really deploys.

Transforms infra/template.yaml with SAM's own translator (the one `sam deploy` uses), then
asserts, for each function's role, the exact actions and resources it is allowed, and that no
managed policy other than basic Lambda logging is attached. Run by infra/deploy/check.sh.
"""
import os
import sys
from pathlib import Path

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class ManagedPolicies:
    """The managed policy names SAM may need to resolve, without calling IAM."""

    def load(self):
        base = "arn:aws:iam::aws:policy/service-role/"
        return {n: base + n for n in ["AWSLambdaBasicExecutionRole", "AWSLambdaSQSQueueExecutionRole"]}


def getatt(name):
    return {"Fn::GetAtt": [name, "Arn"]}


EXPECTED = {
    "IngestFunction": {
        "dynamodb:GetItem": [getatt("TopicsTable"), getatt("SubscriptionsTable")],
        "dynamodb:Query": [getatt("SubscriptionsTable")],
        "dynamodb:PutItem": [getatt("SubscriptionsTable")],
        "sqs:SendMessage": [getatt("DeliveryQueue")],
    },
    "DeliverFunction": {
        "dynamodb:GetItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable")],
        "dynamodb:PutItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable")],
        "dynamodb:UpdateItem": [getatt("DeliveryStateTable")],
        "dynamodb:DeleteItem": [getatt("DeliveryStateTable")],
        "sqs:SendMessage": [getatt("DeliveryQueue"), getatt("DeadLetterQueue")],
        "secretsmanager:GetSecretValue": [
            {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${SecretPrefix}/*"}
        ],
        "sqs:ReceiveMessage": [getatt("DeliveryQueue")],
        "sqs:DeleteMessage": [getatt("DeliveryQueue")],
        "sqs:GetQueueAttributes": [getatt("DeliveryQueue")],
        "sqs:ChangeMessageVisibility": [getatt("DeliveryQueue")],
    },
    "DeadLetterFunction": {
        "s3:PutObject": [{"Fn::Sub": "${DeadLetterBucket.Arn}/*"}],
        "sqs:SendMessage": [getatt("DeadLetterQueue"), getatt("DeliveryQueue")],
        "dynamodb:Query": [getatt("SubscriptionsTable")],
        "sqs:ReceiveMessage": [getatt("DeadLetterQueue")],
        "sqs:DeleteMessage": [getatt("DeadLetterQueue")],
        "sqs:GetQueueAttributes": [getatt("DeadLetterQueue")],
        "sqs:ChangeMessageVisibility": [getatt("DeadLetterQueue")],
    },
}


def main():
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "template.yaml"
    source = yaml_parse(path.read_text())
    for resource in source["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            # What `sam package` does: code locations become S3 objects.
            resource["Properties"]["CodeUri"] = "s3://packaged/code.zip"
    template = transform(source, {}, ManagedPolicies())
    resources = template["Resources"]
    problems = []
    for function, expected in EXPECTED.items():
        role = resources[function + "Role"]["Properties"]
        managed = [a.split("/")[-1] for a in role.get("ManagedPolicyArns", [])]
        if managed != ["AWSLambdaBasicExecutionRole"]:
            problems.append(f"{function}: managed policies {managed}, expected only AWSLambdaBasicExecutionRole")
        granted = {}
        for policy in role.get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                if statement.get("Effect") != "Allow":
                    continue
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                targets = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                for action in actions:
                    granted.setdefault(action, []).extend(targets)
        if granted != expected:
            problems.append(f"{function}: granted {granted}\n  expected {expected}")
    mappings = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    if len(mappings) != 2 or any(m.get("FunctionResponseTypes") != ["ReportBatchItemFailures"] for m in mappings):
        problems.append(f"expected two SQS mappings with ReportBatchItemFailures, got {mappings}")
    if problems:
        print("SAM least-privilege check failed:\n" + "\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"SAM roles hold exactly the expected permissions ({sum(map(len, EXPECTED.values()))} grants, 3 roles)")


main()
