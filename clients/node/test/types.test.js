// The shipped TypeScript types: `tsc --noEmit` over index.d.ts and an application using the
// package (types-check.ts, whose `@ts-expect-error` lines are mistakes the types must catch).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { it } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

it('index.d.ts and a typed application type-check (tsc --noEmit)', () => {
  const tsc = join(here, '..', 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '-p', join(here, 'tsconfig.json')], {
    encoding: 'utf8',
    timeout: 90000,
  });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}\n${r.stderr}`);
});
