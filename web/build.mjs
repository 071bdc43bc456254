// Builds the browser client into web/dist/: one bundled script plus the static page.
// `node build.mjs` builds once; `node build.mjs --watch` rebuilds on change.
import * as esbuild from 'esbuild';
import { copyFile, mkdir } from 'node:fs/promises';

const srcDir = new URL('./src/', import.meta.url);
const distDir = new URL('./dist/', import.meta.url);
const staticFiles = ['index.html', 'style.css'];

async function copyStaticFiles() {
  await mkdir(distDir, { recursive: true });
  for (const name of staticFiles) {
    await copyFile(new URL(name, srcDir), new URL(name, distDir));
  }
}

const options = {
  entryPoints: [new URL('main.js', srcDir).pathname],
  outfile: new URL('app.js', distDir).pathname,
  bundle: true,
  format: 'esm',
  target: ['chrome110', 'firefox115', 'safari16'],
  minify: true,
  sourcemap: true,
  logLevel: 'info',
};

await copyStaticFiles();
if (process.argv.includes('--watch')) {
  const ctx = await esbuild.context(options);
  await ctx.watch();
  console.log('watching src/ (static files are copied only at start)');
} else {
  await esbuild.build(options);
}
