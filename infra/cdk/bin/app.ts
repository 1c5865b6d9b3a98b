#!/usr/bin/env node
/** The CDK app: one stack holding the Gridrelay construct. `npx cdk deploy` from infra/cdk. */
import { App, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Gridrelay } from '../lib/gridrelay';

const app = new App();
const stack = new Stack(app, 'Gridrelay', {
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
});
// `-c architecture=x86_64` (or arm64, the default): what `make test` synthesizes with, to bundle
// the x86_64 builds it already made.
const architectures: Record<string, lambda.Architecture> = {
  arm64: lambda.Architecture.ARM_64,
  x86_64: lambda.Architecture.X86_64,
};
const chosen = app.node.tryGetContext('architecture') ?? 'arm64';
const architecture = architectures[chosen];
if (!architecture) {
  throw new Error(`context architecture is ${JSON.stringify(chosen)}; allowed: arm64, x86_64`);
}
// `-c profile=dev` (or release, the default): the cargo profile the functions are built with;
// `make test` synthesizes with dev, to bundle the unoptimised builds its bootstrap tests run.
const buildProfile = app.node.tryGetContext('profile') ?? 'release';
if (buildProfile !== 'release' && buildProfile !== 'dev') {
  throw new Error(`context profile is ${JSON.stringify(buildProfile)}; allowed: release, dev`);
}
// `-c frontDoor=functionUrl` (or httpApi, the default): what publishers and the portal's visitors
// reach the functions through (#38, docs/front-door.md).
const frontDoor = app.node.tryGetContext('frontDoor') ?? 'httpApi';
if (frontDoor !== 'httpApi' && frontDoor !== 'functionUrl') {
  throw new Error(`context frontDoor is ${JSON.stringify(frontDoor)}; allowed: httpApi, functionUrl`);
}
new Gridrelay(stack, 'Gridrelay', { architecture, buildProfile, frontDoor }).addOutputs();
