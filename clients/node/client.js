#!/usr/bin/env node
// Stream a completion from an infer server: node client.js [--address host:port] [--max-tokens N] PROMPT
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEFAULT_PROTO = path.join(__dirname, '..', '..', 'proto', 'infer', 'v1', 'inference.proto');

function parseArgs(argv) {
  const args = {
    address: process.env.INFER_ADDRESS || '127.0.0.1:50051',
    maxTokens: 64,
    temperature: 0,
    chat: false,
    usage: false,
    prompt: null,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--address') args.address = argv[++i];
    else if (arg === '--max-tokens') args.maxTokens = Number(argv[++i]);
    else if (arg === '--temperature') args.temperature = Number(argv[++i]);
    else if (arg === '--chat') args.chat = true;
    else if (arg === '--usage') args.usage = true;
    else if (arg === '--help' || arg === '-h') args.help = true;
    else args.prompt = arg;
  }
  return args;
}

function loadService(protoPath) {
  const definition = protoLoader.loadSync(protoPath, {
    keepCase: true, // field names as in the .proto (snake_case)
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).infer.v1.InferenceService;
}

function buildRequest(args) {
  const request = { sampling: { max_tokens: args.maxTokens, temperature: args.temperature } };
  if (args.chat) request.messages = { messages: [{ role: 'user', content: args.prompt }] };
  else request.prompt = args.prompt;
  return request;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.help || args.prompt === null) {
    console.error('usage: node client.js [--address host:port] [--max-tokens N] [--temperature T] [--chat] [--usage] PROMPT');
    process.exit(args.help ? 0 : 2);
  }
  const InferenceService = loadService(process.env.INFER_PROTO || DEFAULT_PROTO);
  const client = new InferenceService(args.address, grpc.credentials.createInsecure());
  const stream = client.Generate(buildRequest(args));
  let last = null;
  stream.on('data', (response) => {
    process.stdout.write(response.text);
    last = response;
  });
  stream.on('end', () => {
    process.stdout.write('\n');
    if (args.usage && last && last.usage) {
      console.error(`[${last.finish_reason}] ${JSON.stringify(last.usage)}`);
    }
    client.close();
  });
  stream.on('error', (err) => {
    console.error(`\nerror: ${grpc.status[err.code]}: ${err.details}`);
    client.close();
    process.exitCode = 1;
  });
}

main();
