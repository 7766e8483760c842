// `requireClient(name)`: where the scripts of this folder load ioredis, node-redis and
// cluster-key-slot from. That is the npm install STOCKGATE_NODE_CLIENTS names
// (tests/node-oldest: the oldest majors the project supports; tests/common/node.rs sets it
// for every run), else this folder's own node_modules (the newest majors,
// tests/node/package-lock.json). A plain `require` here always finds this folder's install
// first, whatever NODE_PATH says.
'use strict';

const { createRequire } = require('node:module');
const path = require('node:path');

const dir = path.resolve(process.env.STOCKGATE_NODE_CLIENTS || __dirname);
// Resolves the way a module in `dir` would: from `dir/node_modules` up.
module.exports = createRequire(path.join(dir, 'package.json'));
