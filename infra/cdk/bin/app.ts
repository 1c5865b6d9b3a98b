#!/usr/bin/env node
/** The CDK app: one stack holding the Gridrelay construct. `npx cdk deploy` from infra/cdk. */
import { App, Stack } from 'aws-cdk-lib';
import { Gridrelay } from '../lib/gridrelay';

const app = new App();
const stack = new Stack(app, 'Gridrelay', {
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
});
new Gridrelay(stack, 'Gridrelay').addOutputs();
