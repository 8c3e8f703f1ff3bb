#!/usr/bin/env node
// Writes tests/fixtures/tokenizer/expected.json: the ids GPT-2's own encoder (the npm package
// gpt-3-encoder 1.1.4, pinned by tests/tokenizer/package.json and package-lock.json) gives for
// every tests/fixtures/tokenizer/texts/*.txt. test_tokenizer checks the C tokenizer against it.
//
//   tests/tokenizer/fetch_gpt2.sh build/npm          # or: npm ci --prefix build/npm
//   node scripts/gen_tokenizer_fixtures.js build/npm
//
// The argument is the folder holding node_modules/gpt-3-encoder. Texts must be valid UTF-8:
// JavaScript strings cannot carry other bytes (the C test covers invalid UTF-8 itself).
'use strict';
const fs = require('fs');
const path = require('path');

const PINNED = '1.1.4';
const root = path.resolve(__dirname, '..');
const prefix = path.resolve(process.argv[2] || path.join(root, 'build', 'npm'));
const pkgDir = path.join(prefix, 'node_modules', 'gpt-3-encoder');
const version = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8')).version;
if (version !== PINNED) {
    console.error(`gen_tokenizer_fixtures: ${pkgDir} is version ${version}, not ${PINNED}`);
    process.exit(1);
}
const { encode, decode } = require(pkgDir);

const textDir = path.join(root, 'tests', 'fixtures', 'tokenizer', 'texts');
const names = fs.readdirSync(textDir).filter((n) => n.endsWith('.txt')).sort();
const out = [];
for (const name of names) {
    const bytes = fs.readFileSync(path.join(textDir, name));
    const text = bytes.toString('utf8');
    if (!Buffer.from(text, 'utf8').equals(bytes)) {
        console.error(`gen_tokenizer_fixtures: ${name} is not valid UTF-8`);
        process.exit(1);
    }
    const ids = encode(text);
    if (ids.some((id) => !Number.isInteger(id))) {
        console.error(`gen_tokenizer_fixtures: ${name}: the encoder gave an id that is not one`);
        process.exit(1);
    }
    if (decode(ids) !== text) {
        console.error(`gen_tokenizer_fixtures: ${name}: decode(encode(text)) differs`);
        process.exit(1);
    }
    out.push(`    ${JSON.stringify(name)}: ${JSON.stringify(ids)}`);
}
const header = `  "reference": "gpt-3-encoder ${PINNED} (GPT-2's encoder.json, vocab.bpe and encoder)",\n`;
const body = `{\n${header}  "texts": {\n${out.join(',\n')}\n  }\n}\n`;
const dest = path.join(root, 'tests', 'fixtures', 'tokenizer', 'expected.json');
fs.writeFileSync(dest, body);
console.log(`gen_tokenizer_fixtures: ${names.length} texts -> ${path.relative(root, dest)}`);
